"""GGML tensor types, in one table, by their GGML names ("Q4_K"): block sizes from the
`gguf` package's own (GGML_QUANT_SIZES), which types pxvm's kernels decode, the
reference dequantization (gguf's) and random weights of each type for benchmarks.
Kernels take a type's block sizes from here; only the layout inside a block is written
in each kernel. GGML's numbers for the types are the GGUF files' encoding (`code`), read
at the format's edge only."""

from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

from .registry import require


@dataclass(frozen=True)
class QuantType:
    """A GGML tensor type: `block_values` values in `block_bytes` bytes."""

    ggml: GGMLQuantizationType
    block_values: int
    block_bytes: int

    @property
    def name(self) -> str:
        """GGML's name for the type: the `qtype` ops take."""
        return self.ggml.name

    @property
    def code(self) -> int:
        """GGML's number for the type: how GGUF files (and kernels' constants) say it."""
        return int(self.ggml)

    def row_bytes(self, k: int) -> int:
        """Bytes of a row of `k` values."""
        return k // self.block_values * self.block_bytes


#: The types pxvm's kernels decode, by name.
QUANT_TYPES: dict[str, QuantType] = {
    t.name: QuantType(t, *GGML_QUANT_SIZES[t]) for t in (
        GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16,
        GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1, GGMLQuantizationType.Q5_0,
        GGMLQuantizationType.Q5_1, GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q2_K,
        GGMLQuantizationType.Q3_K, GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K,
        GGMLQuantizationType.Q6_K)}


def supported_names() -> str:
    return ", ".join(QUANT_TYPES)


def quant_type(qtype: str) -> QuantType:
    """The type named `qtype` (GGML's name, "Q4_K"); ShapeError naming the supported ones
    if pxvm has no kernel for it."""
    found = QUANT_TYPES.get(qtype) if isinstance(qtype, str) else None
    if found is None:  # (the message is built only here: this runs at every product)
        hint = (" (a type is named, not numbered: GGMLQuantizationType(n).name)"
                if isinstance(qtype, int) else "")
        require(False, f"unsupported weight type {qtype!r}{hint}; supported: "
                + supported_names())
    return found


def row_bytes(qtype: str, k: int) -> int:
    return quant_type(qtype).row_bytes(k)


# The numpy backend would dequantize every weight on every call; keep the result while the
# raw array lives (weights are loaded once and kept).
_dequantized: dict[int, tuple] = {}


def dequantize(raw: np.ndarray, qtype: str, k: int) -> np.ndarray:
    """(N, K) float32 of the raw (N, row_bytes) uint8 blocks, by gguf's reference code."""
    key = id(raw)
    hit = _dequantized.get(key)
    if hit is not None and hit[0]() is raw:
        return hit[1]
    out = quants.dequantize(np.asarray(raw, np.uint8), quant_type(qtype).ggml)
    out = np.asarray(out, np.float32).reshape(raw.shape[0], k)
    try:
        # the callback holds the dict itself: module globals are gone at interpreter exit
        _dequantized[key] = (weakref.ref(raw, lambda _, key=key, cache=_dequantized:
                                          cache.pop(key, None)), out)
    except TypeError:  # not weak-referenceable: do not cache
        pass
    return out


#: Where each block type keeps its float16 scales: (byte offset, how many) (the gguf
#: package's and llama.cpp's layouts)
F16_SCALES = {
    GGMLQuantizationType.Q4_0: (0, 1), GGMLQuantizationType.Q4_1: (0, 2),
    GGMLQuantizationType.Q5_0: (0, 1), GGMLQuantizationType.Q5_1: (0, 2),
    GGMLQuantizationType.Q8_0: (0, 1), GGMLQuantizationType.Q2_K: (80, 2),
    GGMLQuantizationType.Q3_K: (108, 1), GGMLQuantizationType.Q4_K: (0, 2),
    GGMLQuantizationType.Q5_K: (0, 2), GGMLQuantizationType.Q6_K: (208, 1),
}


def random_weight(rng: np.random.Generator, n: int, k: int, qtype: str) -> np.ndarray:
    """Raw rows (n, row_bytes) of a random weight of any type, made at once (gguf
    quantizes few types, and slowly): random quants with small finite float16 scales, or
    random float rows."""
    t = quant_type(qtype)
    q = GGMLQuantizationType
    if t.ggml in (q.F32, q.F16, q.BF16):
        values = rng.standard_normal((n, k)).astype(np.float32)
        if t.ggml == q.BF16:  # the high half of a float32
            return (values.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8).reshape(n, -1)
        return values.astype(np.float32 if t.ggml == q.F32 else np.float16).view(
            np.uint8).reshape(n, -1)
    blocks = rng.integers(0, 256, (n * k // t.block_values, t.block_bytes), dtype=np.uint8)
    at, count = F16_SCALES[t.ggml]
    blocks[:, at:at + 2 * count] = rng.uniform(0.001, 0.01, (len(blocks), count)).astype(
        np.float16).view(np.uint8)
    if t.ggml == q.Q6_K:  # its int8 sub-block scales: small too
        blocks[:, 192:208] = rng.integers(-8, 8, (len(blocks), 16)).astype(np.int8).view(np.uint8)
    return blocks.reshape(n, t.row_bytes(k))
