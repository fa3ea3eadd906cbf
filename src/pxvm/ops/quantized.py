"""Ops on GGUF-quantized weights (matmul_quant.wgsl): `matmul_quant` multiplies by a
weight kept in its raw GGUF blocks and dequantized inside the kernel, `embedding_quant`
looks rows up. The numpy reference dequantizes with the `gguf` package's own code.

Three fused products serve a transformer layer with one dispatch each where separate
ops would take two or three: `rmsnorm_matmul_quant` (norm, then product),
`matmul_quant_add` (product plus residual) and `rmsnorm_swiglu_quant` (norm, then the
gate and up products joined by SwiGLU)."""

from __future__ import annotations

import weakref

import numpy as np

from .elementwise import silu_ref
from .normalization import rmsnorm_ref
from .registry import meta, register, require

# GGML type numbers -> (values per block, bytes per block)
FORMATS = {0: (1, 4), 1: (1, 2), 2: (32, 18), 3: (32, 20), 8: (32, 34), 12: (256, 144),
           14: (256, 210)}
FORMAT_NAMES = {0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 8: "Q8_0", 12: "Q4_K", 14: "Q6_K"}

# Allowed `lanes` (threads per output column; None lets the op choose).
LANE_CHOICES = (None, 1, 2, 4, 8, 16, 32, 64, 128, 256)

# The numpy backend would dequantize every weight on every call; keep the result while the
# raw array lives (weights are loaded once and kept).
_by_id: dict[int, tuple] = {}


def row_bytes(qtype: int, k: int) -> int:
    per, size = FORMATS[qtype]
    return k // per * size


def dequantize(w: np.ndarray, qtype: int, k: int) -> np.ndarray:
    """(N, K) float32 of the raw (N, row_bytes) uint8 blocks, via gguf's reference code."""
    import gguf

    key = id(w)
    hit = _by_id.get(key)
    if hit is not None and hit[0]() is w:
        return hit[1]
    out = gguf.quants.dequantize(np.asarray(w, np.uint8), gguf.GGMLQuantizationType(qtype))
    out = np.asarray(out, np.float32).reshape(w.shape[0], k)
    try:
        # the callback holds the dict itself: module globals are gone at interpreter exit
        _by_id[key] = (weakref.ref(w, lambda _, key=key, cache=_by_id: cache.pop(key, None)), out)
    except TypeError:  # not weak-referenceable: do not cache
        pass
    return out


def matmul_quant_ref(x, w, qtype=3, k=0, lanes=None):
    """x (M, K) @ W^T for W (N, K) stored as raw GGUF blocks (N, row_bytes) of type qtype."""
    # float32 BLAS: a float64 copy of every weight per call made decoding ~10x slower, and
    # sgemm's blocked sums are well within the comparisons' tolerance.
    return np.asarray(np.asarray(x, np.float32) @ dequantize(w, qtype, k).T, np.float32)


def embedding_quant_ref(ids, w, qtype=3, k=0):
    """Rows ids of W (N, K) stored as raw GGUF blocks: (len(ids), K) float32."""
    return dequantize(w, qtype, k)[np.asarray(ids, np.int64)].astype(np.float32)


def _check_weight(w, qtype, k):
    require(qtype in FORMATS, f"unsupported weight type {qtype}; supported: "
            + ", ".join(f"{t} ({name})" for t, name in FORMAT_NAMES.items()))
    per, _ = FORMATS[qtype]
    require(k > 0 and k % per == 0, f"{FORMAT_NAMES[qtype]} rows need K divisible by {per}, got K={k}")
    require(len(w.shape) == 2 and w.shape[1] == row_bytes(qtype, k),
            f"{FORMAT_NAMES[qtype]} weight of K={k} needs (N, {row_bytes(qtype, k)}) bytes, "
            f"got {tuple(w.shape)}")


def _infer_matmul(x, w, qtype=3, k=0, lanes=None):
    _check_weight(w, qtype, k)
    require(lanes in LANE_CHOICES, f"lanes must be a power of two <= 256, got {lanes}")
    require(len(x.shape) == 2 and x.shape[1] == k,
            f"matmul_quant: x must be (M, {k}), got {tuple(x.shape)}")
    return meta((x.shape[0], w.shape[0]), np.float32)


def rmsnorm_matmul_quant_ref(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    """rmsnorm(x, gain, eps) @ W^T for W stored as raw GGUF blocks."""
    return matmul_quant_ref(rmsnorm_ref(x, gain, eps), w, qtype, k)


def matmul_quant_add_ref(x, w, residual, qtype=3, k=0, lanes=None):
    """residual + x @ W^T for W stored as raw GGUF blocks."""
    return np.asarray(np.asarray(residual, np.float32) + matmul_quant_ref(x, w, qtype, k),
                      np.float32)


def rmsnorm_swiglu_quant_ref(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    """silu(h @ Wg^T) * (h @ Wu^T), h = rmsnorm(x, gain, eps), for W = [Wg; Wu] (2F rows
    of raw GGUF blocks: the gate's F rows, then the up projection's F rows)."""
    both = matmul_quant_ref(rmsnorm_ref(x, gain, eps), w, qtype, k)
    f = w.shape[0] // 2
    return np.asarray(silu_ref(both[:, :f]) * both[:, f:], np.float32)


def _infer_embedding(ids, w, qtype=3, k=0):
    _check_weight(w, qtype, k)
    require(len(ids.shape) == 1, f"embedding ids must be 1-D, got {tuple(ids.shape)}")
    return meta((ids.shape[0], k), np.float32)


def _infer_norm_matmul(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    require(tuple(gain.shape) == (k,), f"the norm's gain must have shape ({k},), got "
            f"{tuple(gain.shape)}")
    return _infer_matmul(x, w, qtype, k, lanes)


def _infer_matmul_add(x, w, residual, qtype=3, k=0, lanes=None):
    m = _infer_matmul(x, w, qtype, k, lanes)
    require(tuple(residual.shape) == m.shape,
            f"matmul_quant_add: the residual must have shape {m.shape}, got {tuple(residual.shape)}")
    return m


def _infer_swiglu(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    m = _infer_norm_matmul(x, gain, w, qtype, k, eps, lanes)
    require(w.shape[0] % 2 == 0, f"rmsnorm_swiglu_quant: W must stack the gate and up rows "
            f"(an even row count), got {w.shape[0]} rows")
    return meta((m.shape[0], m.shape[1] // 2), np.float32)


def _lanes(ctx, lanes, m, n):
    """Threads per output column: 1 on CPU drivers (lavapipe), where the reduction's
    barriers cost more than the parallelism gains (10x slower measured). On GPUs, for
    many rows (prefill) 8; for one row (decoding) a decoded token is a chain of small
    dispatches, each as long as its longest thread: 64, or 16 for very many columns (an
    LM head fills the GPU with columns alone). Each was the fastest of 8 to 128 for its
    product in SmolLM2's decoding step on the H100 (benchmarks/h100/step_variants.py,
    BENCHMARKS.md; the 1,536-long rows of the down projection moved from 32 to 64 once
    the products loaded less per trip: -36 us a step)."""
    if lanes:
        return int(lanes)
    if ctx.is_software:
        return 1
    if m > 1:
        return 8
    return 16 if n >= 16384 else 64


#: The longest attention output (heads x head size) that a product merges from attention's
#: per-range results itself (matmul_quant.wgsl's MAX_MERGED, in workgroup memory).
MAX_MERGED = 2048


def record_product(ctx, x, w, n, qtype, k, *, gain=None, residual=None, eps=0.0, lanes=None,
                   epilogue=0, rows=None, attention=None):
    """Record matmul_quant.wgsl's `matmul`: y (rows, n), rows = x's (default). `gain`
    makes it norm-fused, `epilogue` 1 adds `residual`, 2 is SwiGLU. `attention` =
    (state, head_dim, n_ranges, range_len, max_keys) says that x is attention_cached's
    per-range partial results, merged by the product (ATTENTION_PARTS)."""
    m = x.shape[0] if rows is None else rows
    out = ctx.empty((m, n), np.float32)
    lanes = _lanes(ctx, lanes, m, n)
    rows_per_wg = 256 // lanes
    state, merge = (x, (0, 0, 0, 0)) if attention is None else (attention[0], attention[1:])
    ctx.dispatch("matmul_quant.wgsl", "matmul",
                 [x, w, out, state, x if gain is None else gain,
                  x if residual is None else residual],
                 (m, n, k, row_bytes(qtype, k), float(eps), *merge),
                 ((n + rows_per_wg - 1) // rows_per_wg, m, 1),
                 {"FORMAT": qtype, "LANES": lanes, "NORM": int(gain is not None),
                  "EPILOGUE": epilogue, "ATTENTION_PARTS": int(attention is not None)})
    return out


def matmul_quant_gpu(ctx, x, w, qtype=3, k=0, lanes=None):
    return record_product(ctx, x, w, w.shape[0], qtype, k, lanes=lanes)


def rmsnorm_matmul_quant_gpu(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    return record_product(ctx, x, w, w.shape[0], qtype, k, gain=gain, eps=eps, lanes=lanes)


def matmul_quant_add_gpu(ctx, x, w, residual, qtype=3, k=0, lanes=None):
    return record_product(ctx, x, w, w.shape[0], qtype, k, residual=residual, lanes=lanes,
                          epilogue=1)


def rmsnorm_swiglu_quant_gpu(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    return record_product(ctx, x, w, w.shape[0] // 2, qtype, k, gain=gain, eps=eps,
                          lanes=lanes, epilogue=2)


def embedding_quant_gpu(ctx, ids, w, qtype=3, k=0):
    s = ids.shape[0]
    out = ctx.empty((s, k), np.float32)
    ctx.dispatch("matmul_quant.wgsl", "embed", [w, w, out, ids, w, w],
                 (s, w.shape[0], k, row_bytes(qtype, k), 0.0, 0, 0, 0, 0),
                 ((k + 255) // 256, s, 1),
                 {"FORMAT": qtype})
    return out


matmul_quant = register("matmul_quant", 2, matmul_quant_ref, matmul_quant_gpu, _infer_matmul,
                        input_dtypes=("f32", "u8"))
rmsnorm_matmul_quant = register("rmsnorm_matmul_quant", 3, rmsnorm_matmul_quant_ref,
                                rmsnorm_matmul_quant_gpu, _infer_norm_matmul,
                                input_dtypes=("f32", "f32", "u8"))
matmul_quant_add = register("matmul_quant_add", 3, matmul_quant_add_ref, matmul_quant_add_gpu,
                            _infer_matmul_add, input_dtypes=("f32", "u8", "f32"))
rmsnorm_swiglu_quant = register("rmsnorm_swiglu_quant", 3, rmsnorm_swiglu_quant_ref,
                                rmsnorm_swiglu_quant_gpu, _infer_swiglu,
                                input_dtypes=("f32", "f32", "u8"))
embedding_quant = register("embedding_quant", 2, embedding_quant_ref, embedding_quant_gpu,
                           _infer_embedding, input_dtypes=("i32", "u8"))
