"""Ops on GGUF-quantized weights: `matmul_quant` multiplies by a weight kept in its raw
GGUF blocks (kernels dequantize inside the product), `embedding_quant` looks rows up.
The references dequantize with the `gguf` package's own code (quant_types.py)."""

from __future__ import annotations

import numpy as np

from ..core import tuning
from .quant_types import dequantize, quant_type, random_weight
from .registry import meta, op, require


def check_weight(w, qtype: str, k: int) -> None:
    """ShapeError unless `w` holds the raw rows of a (N, k) weight of type `qtype`."""
    t = quant_type(qtype)
    require(k > 0 and k % t.block_values == 0,
            f"{t.name} rows need K divisible by {t.block_values}, got K={k}")
    require(len(w.shape) == 2 and w.shape[1] == t.row_bytes(k),
            f"{t.name} weight of K={k} needs (N, {t.row_bytes(k)}) bytes, got {tuple(w.shape)}")


def infer_product(x, w, *, qtype, k):
    """Meta of x (M, k) @ W^T for a quantized W (N, k)."""
    check_weight(w, qtype, k)
    require(len(x.shape) == 2 and x.shape[1] == k,
            f"matmul_quant: x must be (M, {k}), got {tuple(x.shape)}")
    return meta((x.shape[0], w.shape[0]), np.float32)


@op(infer=infer_product, input_dtypes=("f32", "u8"))
def matmul_quant(x, w, *, qtype, k, backend="auto"):
    """x (M, K) @ W^T for W (N, K) stored as raw GGUF blocks (N, row_bytes) of type qtype
    (GGML's name: "Q4_K"; quant_types.QUANT_TYPES), rows of k values."""
    # float32 BLAS: a float64 copy of every weight per call made decoding far slower, and
    # sgemm's blocked sums are well within the comparisons' tolerance.
    return np.asarray(np.asarray(x, np.float32) @ dequantize(w, qtype, k).T, np.float32)


def _infer_embedding(ids, w, *, qtype, k, first_row=0):
    check_weight(w, qtype, k)
    require(len(ids.shape) == 1, f"embedding ids must be 1-D, got {tuple(ids.shape)}")
    require(isinstance(first_row, (int, np.integer)) and 0 <= first_row < 2**31,
            f"embedding first_row must be a row number, got {first_row!r}")
    return meta((ids.shape[0], k), np.float32)


@op(infer=_infer_embedding, input_dtypes=("i32", "u8"))
def embedding_quant(ids, w, *, qtype, k, first_row=0, backend="auto"):
    """Rows ids of W (N, K) stored as raw GGUF blocks: (len(ids), K) float32. W may hold
    part of a table, its rows first_row .. first_row + N - 1 (a table too large for one
    GPU buffer comes in parts): ids outside them give rows of zeros, so that the parts'
    lookups add up to the table's."""
    rows = np.asarray(ids, np.int64) - int(first_row)
    held = (rows >= 0) & (rows < w.shape[0])
    out = dequantize(w, qtype, k)[np.where(held, rows, 0)].astype(np.float32)
    out[~held] = 0.0
    return out


def product_cases(shapes, types=None):
    """Tuning cases of matmul_quant for `shapes` (M, N, K): `types`, else a 4-bit weight
    (Q4_K where K allows, else Q4_0) and a Q8_0 one, each random (random_weight)."""
    def cases(rng, backend) -> list[tuning.TuningCase]:
        out = []
        for m, n, k in shapes:
            for qtype in types or ("Q4_K" if k % 256 == 0 else "Q4_0", "Q8_0"):
                w = random_weight(rng, n, k, qtype)
                x = rng.standard_normal((m, k), np.float32)
                tx, tw = backend.from_numpy(x), backend.from_numpy(w)
                out.append(tuning.TuningCase(
                    f"{qtype} {m}x{k} @ {n}x{k}^T",
                    lambda tx=tx, tw=tw, q=qtype, k=k: matmul_quant(tx, tw, qtype=q, k=k),
                    matmul_quant.reference(x, w, qtype=qtype, k=k), 1e-5))
        return out
    return cases
