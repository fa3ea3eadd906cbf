"""Fused ops for a transformer layer: one dispatch (or two) where separate ops would take
several, each named for what it computes.

- `rmsnorm_matmul_quant`: rmsnorm(x) @ W^T (the norm, then the Q/K/V or LM-head product)
- `rmsnorm_glu_quant`: act(h Wg^T) * (h Wu^T) with h = rmsnorm(x), act silu or GELU (the
  feed-forward's first half: SwiGLU or GeGLU)
- `matmul_quant_add`: residual + x @ W^T (the down projection with its residual)
- `qk_norm`: each query and key head of a projected qkv RMS-normalised (Qwen3, Gemma 3)
- `attention_cached`: RoPE, appending the new keys and values to the KV cache, and
  causal attention over it, at a position read from a state tensor on the device, so a
  recorded decoding step is valid at every position (attention_cached.wgsl)
- `attention_cached_matmul_quant_add`: residual + attention_cached(...) @ Wo^T; for one
  token (a decoding step) the output projection merges attention's per-range results
  itself, so a layer's attention is two dispatches however many keys it sees.

Weights are raw GGUF blocks (quantized.py); references are the unfused ops' references.
On CUDA a fused product is one launch of the matrix-vector kernel for decoding's rows
(quantized.record_product_cuda: the norm, the residual's add, the GLU inside it); a
prompt's are the unfused launches in a row (the norm, the product on tensor cores, then
the residual's add or the GLU). The attention is pxvm.kernels.ptx.transformer's kernels.
"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.ptx import attention as ptx_attention
from ..kernels.ptx import elementwise as ptx_elementwise
from ..kernels.ptx import rows as ptx_rows
from ..kernels.ptx import transformer as ptx_transformer
from ..runtime.webgpu.params import KernelParams, f32, kernel_params, u32
from . import tuning
from .attention import FLASH_SHAPE, MAX_HEAD_DIM, attention
from .elementwise import add, gelu_tanh, silu
from .layouts import AttentionPartials
from .normalization import (NormParams, check_rope, record_rmsnorm_cuda, rmsnorm, rope,
                            rope_table)
from .quantized import (MAX_MERGED, infer_product, matmul_quant, matvec_takes, prompt_takes,
                        record_product, record_product_cuda, record_prompt_glu,
                        record_prompt_product)
from .registry import MissingKernelError, meta, op, require

# ---- fused products -------------------------------------------------------------------
WEIGHT_INPUTS = ("f32", "f32", "u8")  # x, gain, W


def _cuda(unfused, what: str):
    """Op `unfused`'s CUDA kernel (the fused ops' CUDA kernels are made of them)."""
    kernel = unfused.kernels.get("cuda")
    if kernel is None:
        raise MissingKernelError(f"op {what} on CUDA needs op {unfused.name}'s CUDA kernel, "
                                 "which it has not yet; run it on webgpu, cpu or numpy")
    return kernel


def _product_cuda(ctx, x, w, qtype, k, lanes, what: str):
    """x @ W^T by matmul_quant's CUDA kernel (MissingKernelError for types it lacks)."""
    return _cuda(matmul_quant, what)(ctx, x, w, qtype=qtype, k=k, lanes=lanes)


def _normed_cuda(ctx, x, gain, eps, what: str):
    return _cuda(rmsnorm, what)(ctx, x, gain, eps=eps)


def _fused_product_cuda(ctx, x, w, qtype, k, lanes, what: str, gain=None, eps=0.0,
                        residual=None, activation=None):
    """[residual +] h @ W^T (act(h Wg^T) * (h Wu^T) with `activation`), h = rmsnorm(x,
    gain, eps) with a gain, else x: one launch for decoding's rows (quantized.
    matvec_takes); for a prompt's (tensor cores) and float rows of other lengths the
    unfused launches in a row."""
    if matvec_takes(x.shape[0], k):
        return record_product_cuda(ctx, x, w, qtype, k, gain=gain, eps=eps, residual=residual,
                                   activation=activation)
    if prompt_takes(x.shape[0], k):  # the norm writes float16, the product adds
        h = x if gain is None else record_rmsnorm_cuda(ctx, x, gain, eps, half=True)
        if activation is not None:  # the GLU in the product's pass where it can
            glu = record_prompt_glu(ctx, h, w, qtype, k, activation)
            if glu is not None:
                return glu
        product = record_prompt_product(ctx, h, w, qtype, k, residual=residual)
        if residual is not None:
            return product
    else:
        h = x if gain is None else _normed_cuda(ctx, x, gain, eps, what)
        product = _product_cuda(ctx, h, w, qtype, k, lanes, what)
    if residual is not None:
        return _cuda(add, what)(ctx, product, residual)
    if activation is None:
        return product
    m, f = x.shape[0], w.shape[0] // 2
    out = ctx.empty((m, f), np.float32)
    vec = 4 if f % 4 == 0 else 1
    groups = m * f // vec
    if groups:
        ctx.launch(ptx_elementwise.glu, (activation, vec), [product, out, groups, f // vec],
                   ctx.stride_grid(groups))
    return out


def _infer_norm_product(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    require(tuple(gain.shape) == (k,), f"the norm's gain must have shape ({k},), got "
            f"{tuple(gain.shape)}")
    return infer_product(x, w, qtype, k, lanes)


def _rmsnorm_matmul_quant_webgpu(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    return record_product(ctx, x, w, w.shape[0], qtype, k, gain=gain, eps=eps, lanes=lanes)


def _rmsnorm_matmul_quant_cpu(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    out = ctx.empty((x.shape[0], w.shape[0]), np.float32)
    ctx.call("transformer", "norm_matmul", x, gain, float(eps), ctx.packed(w, qtype, k), out)
    return out


def _rmsnorm_matmul_quant_cuda(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None):
    return _fused_product_cuda(ctx, x, w, qtype, k, lanes, "rmsnorm_matmul_quant", gain=gain,
                               eps=eps)


@op(infer=_infer_norm_product, input_dtypes=WEIGHT_INPUTS, webgpu=_rmsnorm_matmul_quant_webgpu,
    cpu=_rmsnorm_matmul_quant_cpu, cuda=_rmsnorm_matmul_quant_cuda)
def rmsnorm_matmul_quant(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None, *, backend="auto"):
    """rmsnorm(x, gain, eps) @ W^T for W stored as raw GGUF blocks."""
    return matmul_quant.reference(rmsnorm.reference(x, gain, eps), w, qtype, k)


def _infer_product_add(x, w, residual, qtype=3, k=0, lanes=None):
    m = infer_product(x, w, qtype, k, lanes)
    require(tuple(residual.shape) == m.shape,
            f"matmul_quant_add: the residual must have shape {m.shape}, got {tuple(residual.shape)}")
    return m


def _matmul_quant_add_webgpu(ctx, x, w, residual, qtype=3, k=0, lanes=None):
    return record_product(ctx, x, w, w.shape[0], qtype, k, residual=residual, lanes=lanes,
                          epilogue=1)


def _matmul_quant_add_cpu(ctx, x, w, residual, qtype=3, k=0, lanes=None):
    out = ctx.empty((x.shape[0], w.shape[0]), np.float32)
    ctx.call("transformer", "matmul_add", x, ctx.packed(w, qtype, k), residual, out)
    return out


def _matmul_quant_add_cuda(ctx, x, w, residual, qtype=3, k=0, lanes=None):
    return _fused_product_cuda(ctx, x, w, qtype, k, lanes, "matmul_quant_add",
                               residual=residual)


@op(infer=_infer_product_add, input_dtypes=("f32", "u8", "f32"), webgpu=_matmul_quant_add_webgpu,
    cpu=_matmul_quant_add_cpu, cuda=_matmul_quant_add_cuda)
def matmul_quant_add(x, w, residual, qtype=3, k=0, lanes=None, *, backend="auto"):
    """residual + x @ W^T for W stored as raw GGUF blocks."""
    return np.asarray(np.asarray(residual, np.float32) + matmul_quant.reference(x, w, qtype, k),
                      np.float32)


#: The gated feed-forwards' activations (applied to the gate): SwiGLU's and GeGLU's,
#: each with its matmul_quant.wgsl EPILOGUE.
GLU_ACTIVATIONS = {"silu": 2, "gelu_tanh": 3}


def _infer_glu(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None, activation="silu"):
    m = _infer_norm_product(x, gain, w, qtype, k, eps, lanes)
    require(w.shape[0] % 2 == 0, f"rmsnorm_glu_quant: W must stack the gate and up rows "
            f"(an even row count), got {w.shape[0]} rows")
    require(activation in GLU_ACTIVATIONS, f"rmsnorm_glu_quant: activation must be one of "
            f"{', '.join(GLU_ACTIVATIONS)}, got {activation!r}")
    return meta((m.shape[0], m.shape[1] // 2), np.float32)


def _rmsnorm_glu_quant_webgpu(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None,
                              activation="silu"):
    return record_product(ctx, x, w, w.shape[0] // 2, qtype, k, gain=gain, eps=eps,
                          lanes=lanes, epilogue=GLU_ACTIVATIONS[activation])


def _rmsnorm_glu_quant_cpu(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None,
                           activation="silu"):
    out = ctx.empty((x.shape[0], w.shape[0] // 2), np.float32)
    ctx.call("transformer", "norm_glu", x, gain, float(eps), ctx.packed(w, qtype, k),
             activation == "gelu_tanh", out)
    return out


def _rmsnorm_glu_quant_cuda(ctx, x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None,
                            activation="silu"):
    return _fused_product_cuda(ctx, x, w, qtype, k, lanes, "rmsnorm_glu_quant", gain=gain,
                               eps=eps, activation=activation)


@op(infer=_infer_glu, input_dtypes=WEIGHT_INPUTS, webgpu=_rmsnorm_glu_quant_webgpu,
    cpu=_rmsnorm_glu_quant_cpu, cuda=_rmsnorm_glu_quant_cuda)
def rmsnorm_glu_quant(x, gain, w, qtype=3, k=0, eps=1e-6, lanes=None, activation="silu", *,
                      backend="auto"):
    """act(h @ Wg^T) * (h @ Wu^T), h = rmsnorm(x, gain, eps), for W = [Wg; Wu] (2F rows
    of raw GGUF blocks: the gate's F rows, then the up projection's F rows); act is silu
    (SwiGLU) or gelu_tanh (GeGLU)."""
    both = matmul_quant.reference(rmsnorm.reference(x, gain, eps), w, qtype, k)
    f = w.shape[0] // 2
    act = silu if activation == "silu" else gelu_tanh
    return np.asarray(act.reference(both[:, :f]) * both[:, f:], np.float32)


# ---- QK norm --------------------------------------------------------------------------
def _infer_qk_norm(qkv, q_gain, k_gain, n_heads=1, n_kv_heads=1, eps=1e-6):
    d = q_gain.shape[0] if len(q_gain.shape) == 1 else 0
    require(len(q_gain.shape) == 1 and tuple(k_gain.shape) == (d,) and d >= 1,
            f"qk_norm: the gains must be two vectors of the head size, got "
            f"{tuple(q_gain.shape)} and {tuple(k_gain.shape)}")
    require(n_heads >= 1 and n_kv_heads >= 1 and len(qkv.shape) == 2
            and qkv.shape[1] == (n_heads + 2 * n_kv_heads) * d,
            f"qk_norm: qkv must be (S, {(n_heads + 2 * n_kv_heads) * d}) for {n_heads} query "
            f"heads and {n_kv_heads} key/value heads of {d}, got {tuple(qkv.shape)}")
    return meta(tuple(qkv.shape), np.float32)


def _qk_norm_webgpu(ctx, qkv, q_gain, k_gain, n_heads=1, n_kv_heads=1, eps=1e-6):
    out = ctx.empty(qkv.shape, np.float32)
    d = q_gain.shape[0]
    rows = qkv.size // d
    ctx.dispatch("norm.wgsl", "qk_norm", [qkv, q_gain, k_gain, out],
                 NormParams(rows, d, float(eps)), rows,
                 {"Q_HEADS": n_heads, "KV_HEADS": n_kv_heads})
    return out


def _qk_norm_cuda(ctx, qkv, q_gain, k_gain, n_heads=1, n_kv_heads=1, eps=1e-6):
    out = ctx.empty(qkv.shape, np.float32)
    d = q_gain.shape[0]
    heads = qkv.size // d
    ctx.launch(ptx_rows.qk_norm, (), [qkv, q_gain, k_gain, out, heads, n_heads, n_kv_heads, d,
                                      eps], -(-heads // ptx_rows.WARPS), block=ptx_rows.THREADS)
    return out


@op(infer=_infer_qk_norm, input_dtypes=("f32", "f32", "f32"), webgpu=_qk_norm_webgpu,
    cuda=_qk_norm_cuda)
def qk_norm(qkv, q_gain, k_gain, n_heads=1, n_kv_heads=1, eps=1e-6, *, backend="auto"):
    """qkv (S, (n_heads + 2 n_kv_heads) D) with each query head rmsnorm'ed by q_gain and
    each key head by k_gain (D values each); the value heads unchanged."""
    qkv = np.asarray(qkv, np.float32)
    d = np.asarray(q_gain).shape[0]
    heads = qkv.reshape(qkv.shape[0], -1, d).copy()
    heads[:, :n_heads] = rmsnorm.reference(heads[:, :n_heads], q_gain, eps)
    keys = slice(n_heads, n_heads + n_kv_heads)
    heads[:, keys] = rmsnorm.reference(heads[:, keys], k_gain, eps)
    return heads.reshape(qkv.shape)


# ---- attention over a KV cache --------------------------------------------------------
CACHED_KERNEL = "attention_cached.wgsl"
#: attention_cached.wgsl with its reductions by subgroup operations (tuning.subgroup_variant)
CACHED_SUBGROUP_KERNEL = "attention_cached_subgroups.wgsl"
CACHED_CHUNK = 64  # keys per trip of attention_cached.wgsl's `split` (its CHUNK)
# The keys a token may see are cut into at most CACHED_MAX_RANGES ranges, one workgroup
# each per (token, head); their results are merged by `combine` or by the output
# projection. Bounds of at most CACHED_ONE_RANGE_MAX_KEYS keys take one range, which
# needs no merge: `attention_cached` then runs in one dispatch. Both were chosen on the
# H100 with SmolLM2's decoding step (BENCHMARKS.md, "attention ranges").
CACHED_MAX_RANGES = 16
CACHED_ONE_RANGE_MAX_KEYS = 64
# Every workgroup of the output projection merges its token's ranges again: for one
# token (a decoding step) that costs less than a `combine` pass and the wait for it, for
# a prompt's many tokens more (measured with a 512-token prefill on the H100).
PRODUCT_MERGES_MAX_TOKENS = 1


# A prompt's many new tokens: attention_prompt.wgsl's `tiled` takes a block of tokens of
# one query head a workgroup and walks the keys they see in tiles through workgroup
# memory (after its `append` wrote the new keys and values), so each key is loaded once
# per block, not once per token; it writes the output itself (no ranges to merge).
# prompt_tiled_takes says where; PROMPT_TILED_MIN_TOKENS is the fewest new tokens it
# takes (fewer make too few workgroups to fill a GPU while they walk the keys).
PROMPT_KERNEL = "attention_prompt.wgsl"
PROMPT_TILED_MIN_TOKENS = 32
PROMPT_WG = 128             # attention_prompt.wgsl's WG
PROMPT_MAX_ROWS = 32        # tokens a workgroup at most (its QUERY_ROWS)
PROMPT_MIN_ROWS = 4         # .. and at least, where the head size allows
PROMPT_MAX_TILE_KEYS = 32   # keys a tile at most (its TILE_KEYS)
# Workgroup memory a tile shape may use: WebGPU's guaranteed minimum, so that every
# device (and browser) takes it.
PROMPT_WORKGROUP_BYTES = 16384


@kernel_params(CACHED_KERNEL, CACHED_SUBGROUP_KERNEL, PROMPT_KERNEL)
class CachedAttentionParams(KernelParams):
    s: u32          # new tokens (rows of qkv)
    hq: u32
    hkv: u32
    n_ctx: u32      # rows of the caches
    n_ranges: u32   # key ranges in the grid (and per token in the partials)
    range_len: u32  # keys per range, a multiple of CACHED_CHUNK
    max_keys: u32   # the bound the grid was recorded for (at most n_ctx)
    scale: f32
    softcap: f32    # scores become softcap * tanh(score / softcap); 0: not capped
    window: u32     # a token sees its last `window` keys (itself included); 0: all


def cached_key_ranges(bound: int) -> tuple[int, int]:
    """(ranges, keys per range) covering `bound` keys: one range up to
    CACHED_ONE_RANGE_MAX_KEYS keys, else the fewest chunk-aligned ranges of equal length,
    at most CACHED_MAX_RANGES."""
    chunk = CACHED_CHUNK
    if bound <= CACHED_ONE_RANGE_MAX_KEYS:
        return 1, -(-bound // chunk) * chunk
    range_len = chunk * -(-bound // (chunk * CACHED_MAX_RANGES))
    return -(-bound // range_len), range_len


def _infer_cached(qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                  style="interleaved", scale=None, max_keys=None, freq_factors=None,
                  attn_factor=1.0, softcap=0.0, window=0):
    require(len(k_cache.shape) == 3 and tuple(k_cache.shape) == tuple(v_cache.shape),
            f"attention_cached: caches must both be (n_ctx, Hkv, D), got {tuple(k_cache.shape)} "
            f"and {tuple(v_cache.shape)}")
    n_ctx, hkv, d = k_cache.shape
    require(n_heads >= 1 and n_heads % hkv == 0,
            f"query heads ({n_heads}) must be a multiple of key/value heads ({hkv})")
    require(d % 2 == 0 and 2 <= d <= MAX_HEAD_DIM,
            f"head dimension must be even and at most {MAX_HEAD_DIM}, got {d}")
    require(len(qkv.shape) == 2 and qkv.shape[1] == (n_heads + 2 * hkv) * d and qkv.shape[0] >= 1,
            f"attention_cached: qkv must be (S, {(n_heads + 2 * hkv) * d}) for {n_heads} query "
            f"heads and {hkv} key/value heads of {d}, got {tuple(qkv.shape)}")
    require(np.dtype(state.dtype) == np.int32 and state.size >= 2,
            "attention_cached: state must be an int32 tensor [token, position, ...]")
    check_rope(d, style, freq_factors, attn_factor)
    require(math.isfinite(softcap) and softcap >= 0,
            f"attention softcap must be finite and at least 0 (0: none), got {softcap}")
    require(isinstance(window, (int, np.integer)) and 0 <= window < 2**32,
            f"attention window must be a count of keys (0: all), got {window!r}")
    s = qkv.shape[0]
    if max_keys is not None and max_keys > n_ctx and window > 0:  # a ring (cached_rows)
        require(n_ctx % CACHED_CHUNK == 0 and n_ctx >= window + s - 1,
                f"attention_cached: max_keys={max_keys} is beyond the cache's {n_ctx} rows, "
                f"which holds positions as a ring only in {CACHED_CHUNK}-row multiples of at "
                f"least window + new tokens - 1 = {window + s - 1} rows")
    else:
        require(max_keys is None or s <= max_keys <= n_ctx,
                f"max_keys must be in {s}..{n_ctx} (beyond the cache only with a window), "
                f"got {max_keys}")
    return meta((s, n_heads * d), np.float32)


def cached_rows(window: int, new_tokens: int, positions: int) -> int:
    """Rows of a KV cache for `positions` positions: all of them, or for a sliding window
    fewer, as a ring (attention_cached's): the window and one pass's new tokens, in whole
    CACHED_CHUNKs."""
    if not window:
        return positions
    ring = -(-(window + new_tokens - 1) // CACHED_CHUNK) * CACHED_CHUNK
    return min(ring, positions)


def prompt_tiled_takes(tokens: int, head_dim: int, ring: bool) -> bool:
    """Whether attention_cached of `tokens` new tokens runs attention_prompt.wgsl (the
    tiled prompt attention) on WebGPU: a prompt of at least PROMPT_TILED_MIN_TOKENS
    tokens over a cache that is not a ring, with a head size of whole quads (the kernel
    loads four elements at a time)."""
    return tokens >= PROMPT_TILED_MIN_TOKENS and not ring and head_dim % 4 == 0


def prompt_tile_bytes(head_dim: int, rows: int, keys: int) -> int:
    """Workgroup memory of attention_prompt.wgsl's `tiled` for a tile of `rows` tokens by
    `keys` keys: the queries' and the keys' (or values') rows of head_dim / 4 + 1 quads,
    the partial scores, a float a row and one a thread."""
    quads = head_dim // 4 + 1
    parts = max(1, PROMPT_WG // ((rows // 2) * (keys // 2)))
    return 16 * (rows + keys) * quads + 4 * parts * rows * keys + 4 * rows + 4 * PROMPT_WG


def prompt_tiles(head_dim: int, budget: int | None = None) -> tuple[int, int]:
    """(tokens a workgroup, keys a tile) of attention_prompt.wgsl for `head_dim`, powers
    of two within `budget` bytes of workgroup memory (default PROMPT_WORKGROUP_BYTES):
    first the longest tile of keys (at most PROMPT_MAX_TILE_KEYS, and at most four quads
    of it a thread) beside a block of PROMPT_MIN_ROWS tokens, then the most tokens beside
    it (at most PROMPT_MAX_ROWS, and at most four output quads a thread). Longer tiles
    mean fewer trips through the keys, fewer tokens more workgroups."""
    budget = PROMPT_WORKGROUP_BYTES if budget is None else budget
    quads = head_dim // 4
    keys = PROMPT_MAX_TILE_KEYS
    while keys > 2 and (keys * quads > 4 * PROMPT_WG
                        or prompt_tile_bytes(head_dim, PROMPT_MIN_ROWS, keys) > budget):
        keys //= 2
    rows = PROMPT_MAX_ROWS
    while rows > 2 and (rows > 4 * (PROMPT_WG // quads)
                        or prompt_tile_bytes(head_dim, rows, keys) > budget):
        rows //= 2
    return rows, keys


def _attend_tiled(ctx, qkv, k_cache, v_cache, state, table, params, style):
    """attention_prompt.wgsl: `append` (the new keys and values into the caches), then
    `tiled` over blocks of tokens of each query head; returns the attention output."""
    s = qkv.shape[0]
    _, hkv, d = k_cache.shape
    rows, keys = prompt_tiles(d)
    out = ctx.empty((s, params.hq * d), np.float32)
    tensors = [qkv, k_cache, v_cache, state, table, out]
    constants = {"NEOX": int(style == "neox"), "HEAD_DIM": d, "QUERY_ROWS": rows,
                 "TILE_KEYS": keys}
    ctx.dispatch(PROMPT_KERNEL, "append", tensors, params, -(-s * hkv * d // PROMPT_WG),
                 constants)
    ctx.dispatch(PROMPT_KERNEL, "tiled", tensors, params, (-(-s // rows), params.hq, 1),
                 constants)
    return out


def _attend(ctx, qkv, k_cache, v_cache, state, bound, n_heads, theta, style, scale,
            freq_factors, attn_factor, softcap, window):
    """Record the attention over the keys below `bound`: a prompt's where
    prompt_tiled_takes (attention_prompt.wgsl), else `split`. With one range or tiled:
    (the attention output, None, None). Else (the ranges' partial results, their
    AttentionPartials, a function recording `combine`, which merges them and returns the
    output), leaving the merge to the caller: `combine`, or the output projection."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    table = rope_table(ctx, theta, d, max(n_ctx, bound), freq_factors, attn_factor)
    if prompt_tiled_takes(s, d, bound > n_ctx):
        params = CachedAttentionParams(s, n_heads, hkv, n_ctx, 1, 0, bound, scale,
                                       float(softcap), int(window))
        return _attend_tiled(ctx, qkv, k_cache, v_cache, state, table, params, style), None, None
    n_ranges, range_len = cached_key_ranges(bound)
    partials = AttentionPartials(d, n_ranges, range_len, bound)
    part = ctx.empty((1 if n_ranges == 1 else s * n_heads * n_ranges, partials.stride),
                     np.float32, "attention partial sums")
    out = ctx.empty((s, n_heads * d), np.float32)
    tensors = [qkv, k_cache, v_cache, state, table, part, out]
    params = CachedAttentionParams(s, n_heads, hkv, n_ctx, n_ranges, range_len, bound, scale,
                                   float(softcap), int(window))
    constants = {"NEOX": int(style == "neox"), "RING": int(bound > n_ctx), "HEAD_DIM": d,
                 **partials.constants()}
    kernel = tuning.subgroup_variant(ctx, CACHED_KERNEL, CACHED_SUBGROUP_KERNEL)
    ctx.dispatch(kernel, "split", tensors, params, (n_ranges, n_heads, s), constants)
    if n_ranges == 1:
        return out, None, None

    def combine():
        ctx.dispatch(kernel, "combine", tensors, params, (n_heads, s, 1), constants)
        return out

    return part, partials, combine


def _attention_cached_webgpu(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                             style="interleaved", scale=None, max_keys=None, freq_factors=None,
                             attn_factor=1.0, softcap=0.0, window=0):
    result, _, combine = _attend(ctx, qkv, k_cache, v_cache, state,
                                 max_keys or k_cache.shape[0], n_heads, theta, style, scale,
                                 freq_factors, attn_factor, softcap, window)
    return result if combine is None else combine()


def _attention_cached_cpu(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                          style="interleaved", scale=None, max_keys=None, freq_factors=None,
                          attn_factor=1.0, softcap=0.0, window=0):
    n_ctx, _, d = k_cache.shape
    out = ctx.empty((qkv.shape[0], n_heads * d), np.float32)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bound = max_keys or n_ctx
    ctx.call("transformer", "attention_cached", qkv, k_cache, v_cache, state,
             rope_table(ctx, theta, d, max(n_ctx, bound), freq_factors, attn_factor), n_heads,
             style == "neox", np.float32(scale), np.float32(softcap), int(window), bound, out)
    return out


#: On CUDA, where fewer than CUDA_SPLIT_MAX_BLOCKS (token, query head) pairs meet more
#: than CUDA_ONE_RANGE_KEYS keys (decoding), the keys are cut into at most
#: CUDA_MAX_RANGES ranges of a multiple of CUDA_RANGE_KEYS keys, a block each, merged by
#: the last of them to finish: one block per pair would leave most of a large GPU idle
#: (132 SMs on an H100) while it walks a long cache. Up to CUDA_ONE_RANGE_KEYS one block
#: walks them all: cheaper than ranges and their merge there (both measured with
#: benchmarks/h100/decode_variants.py: BENCHMARKS.md, "Language models on CUDA"; tests
#: set smaller values, to cut short caches into ranges).
CUDA_SPLIT_MAX_BLOCKS = 512
CUDA_ONE_RANGE_KEYS = ptx_transformer.CHUNK
CUDA_RANGE_KEYS = 32
CUDA_MAX_RANGES = 64
assert CUDA_MAX_RANGES <= ptx_transformer.MAX_RANGES
#: decoding's attention on sm_90: "loads" reads its range's first keys and values before
#: the kernel waits for the QKV product (the attend kernel's `early`), "none" after
CUDA_DECODE_EARLY = "loads"


def cuda_key_ranges(bound: int, pairs: int) -> tuple[int, int]:
    """(ranges, keys per range) of the CUDA attention over `bound` keys for `pairs`
    (token, query head) pairs."""
    if pairs >= CUDA_SPLIT_MAX_BLOCKS or bound <= CUDA_ONE_RANGE_KEYS:
        return 1, bound
    range_len = CUDA_RANGE_KEYS * -(-bound // (CUDA_RANGE_KEYS * CUDA_MAX_RANGES))
    return -(-bound // range_len), range_len


def _attention_cached_cuda(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                           style="interleaved", scale=None, max_keys=None, freq_factors=None,
                           attn_factor=1.0, softcap=0.0, window=0, half=False):
    """pxvm.kernels.ptx.transformer's `append` and `attend` (which merges the ranges the
    keys are cut into, where they are, and appends a single token itself); `half`: the
    output in float16."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    bound = max_keys or n_ctx
    neox, ring = style == "neox", bound > n_ctx  # a ring: max_keys beyond the cache
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    table = rope_table(ctx, theta, d, max(n_ctx, bound), freq_factors, attn_factor)
    appends = s == 1  # decoding: `attend` appends the token's key and value itself
    elements = s * hkv * d
    if not appends:
        ctx.launch(ptx_transformer.append, (neox, ring),
                   [qkv, k_cache, v_cache, state, table, elements, n_heads, hkv, d, n_ctx,
                    bound], ctx.stride_grid(elements))
    n_ranges, range_len = cuda_key_ranges(bound, s * n_heads)
    out = ctx.empty((s, n_heads * d), np.float16 if half else np.float32)
    part = ctx.empty((s * n_heads * n_ranges, d + 2) if n_ranges > 1 else (1,), np.float32,
                     "attention partial sums")  # AttentionPartials' records
    counts = ctx.counters(s * n_heads if n_ranges > 1 else 1)
    vec = next(v for v in ptx_transformer.VECS if d % v == 0)
    early = appends and CUDA_DECODE_EARLY == "loads" and ctx.device.info.arch == "sm_90"
    ctx.launch(ptx_transformer.attend, (neox, ring, vec, half, appends, early),
               [qkv, k_cache, v_cache, state, table, part, counts, out, n_heads, hkv, d,
                n_ctx, n_ranges, range_len, bound, scale, float(softcap), int(window)],
               (n_ranges, n_heads, s), block=ptx_transformer.THREADS)
    return out


@op(infer=_infer_cached, input_dtypes=("f32", "f32", "f32", "i32"),
    webgpu=_attention_cached_webgpu, cpu=_attention_cached_cpu, cuda=_attention_cached_cuda)
def attention_cached(qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                     style="interleaved", scale=None, max_keys=None, freq_factors=None,
                     attn_factor=1.0, softcap=0.0, window=0, *, backend="auto"):
    """Attention of S new tokens at positions pos.. (pos = state[1]) over a KV cache.

    qkv (S, (n_heads + 2 Hkv) D) holds each token's query heads, key heads and value
    heads; caches are (n_ctx, Hkv, D). Queries and keys get the rotary embedding at their
    positions, the new keys and values are written into the caches at rows pos..pos+S-1
    (in place), and each query attends causally to cache rows 0..its own position (its
    last `window` rows when window > 0: sliding-window attention). With a window, the
    caches may be rings (cached_rows): position j in row j % n_ctx, max_keys beyond n_ctx. Scores are q.k * scale
    (default 1/sqrt(D)), capped to softcap * tanh(score / softcap) when softcap > 0;
    freq_factors and attn_factor change the rotation as in `rope`. Returns (S, n_heads * D).

    `max_keys` (default n_ctx) bounds the GPU's grid, so positions must keep
    pos + S <= max_keys. Here that is checked; the GPU reads pos on the device, where no
    error can be raised, so it returns NaN rows for tokens beyond the bound instead of
    attending over part of their keys."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    pos = int(np.asarray(state).reshape(-1)[1])
    ring = max_keys is not None and max_keys > n_ctx
    require(0 <= pos and (ring or pos + s <= n_ctx),
            f"attention_cached: positions {pos}..{pos + s - 1} are outside the cache of "
            f"{n_ctx} rows")
    require(max_keys is None or pos + s <= max_keys,
            f"attention_cached: positions {pos}..{pos + s - 1} reach beyond max_keys="
            f"{max_keys}; record with a larger max_keys")
    q, k, v = np.split(np.asarray(qkv, np.float32), [n_heads * d, (n_heads + hkv) * d], axis=1)
    turn = dict(theta=theta, style=style, freq_factors=freq_factors, attn_factor=attn_factor)
    q = rope.reference(q.reshape(s, n_heads, d), pos, **turn)
    new_rows = np.arange(pos, pos + s) % n_ctx
    k_cache[new_rows] = rope.reference(k.reshape(s, hkv, d), pos, **turn)
    v_cache[new_rows] = v.reshape(s, hkv, d)
    if not softcap and not window:
        out = attention.reference(q, k_cache[: pos + s], v_cache[: pos + s], causal=True,
                                  scale=scale)
        return out.reshape(s, n_heads * d)
    # float64 attention with the cap and the window, per query head, over the positions
    # the cache still holds (a ring holds the last n_ctx)
    held = np.arange(max(0, pos + s - n_ctx), pos + s)
    keys = np.asarray(k_cache[held % n_ctx], np.float64)
    values = np.asarray(v_cache[held % n_ctx], np.float64)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    at = pos + np.arange(s)[:, None]
    seen = held[None, :] <= at
    if window:
        seen &= held[None, :] > at - window
    out = np.empty((s, n_heads, d))
    for h in range(n_heads):
        scores = np.asarray(q[:, h], np.float64) @ keys[:, h * hkv // n_heads].T * scale
        if softcap:
            scores = softcap * np.tanh(scores / softcap)
        scores = np.where(seen, scores, -np.inf)
        p = np.exp(scores - scores.max(axis=1, keepdims=True))
        out[:, h] = (p / p.sum(axis=1, keepdims=True)) @ values[:, h * hkv // n_heads]
    return out.reshape(s, n_heads * d).astype(np.float32)


def _infer_cached_product(qkv, k_cache, v_cache, state, w, residual, n_heads=1, theta=10000.0,
                          style="interleaved", scale=None, max_keys=None, qtype=3, k=0,
                          lanes=None, freq_factors=None, attn_factor=1.0, softcap=0.0,
                          window=0):
    att = _infer_cached(qkv, k_cache, v_cache, state, n_heads, theta, style, scale, max_keys,
                        freq_factors, attn_factor, softcap, window)
    require(k == att.shape[1], f"attention_cached_matmul_quant_add: the output projection "
            f"takes the attention output, K = n_heads * head dim = {att.shape[1]}; got k={k}")
    return matmul_quant_add.infer([att, w, residual], {"qtype": qtype, "k": k, "lanes": lanes})


def _attention_cached_matmul_quant_add_webgpu(ctx, qkv, k_cache, v_cache, state, w, residual,
                                              n_heads=1, theta=10000.0, style="interleaved",
                                              scale=None, max_keys=None, qtype=3, k=0,
                                              lanes=None, freq_factors=None, attn_factor=1.0,
                                              softcap=0.0, window=0):
    n_ctx, _, d = k_cache.shape
    result, partials, combine = _attend(ctx, qkv, k_cache, v_cache, state, max_keys or n_ctx,
                                        n_heads, theta, style, scale, freq_factors,
                                        attn_factor, softcap, window)
    tokens = qkv.shape[0]
    if combine is None or tokens > PRODUCT_MERGES_MAX_TOKENS or n_heads * d > MAX_MERGED:
        attended = result if combine is None else combine()
        return record_product(ctx, attended, w, w.shape[0], qtype, k, residual=residual,
                              lanes=lanes, epilogue=1)
    return record_product(ctx, result, w, w.shape[0], qtype, k, residual=residual,
                          lanes=lanes, epilogue=1, rows=tokens, merge=(state, partials))


def _attention_cached_matmul_quant_add_cpu(ctx, qkv, k_cache, v_cache, state, w, residual,
                                           n_heads=1, theta=10000.0, style="interleaved",
                                           scale=None, max_keys=None, qtype=3, k=0,
                                           lanes=None, freq_factors=None, attn_factor=1.0,
                                           softcap=0.0, window=0):
    attended = _attention_cached_cpu(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style,
                                     scale, max_keys, freq_factors, attn_factor, softcap,
                                     window)
    return _matmul_quant_add_cpu(ctx, attended, w, residual, qtype, k)


def _flash_takes(k_cache, max_keys, softcap, window, scale) -> bool:
    """Whether a prompt's attention runs on tensor cores (_flash_attention_cuda): a plain
    cache (no ring, window or soft-cap) of a head size the kernel has."""
    n_ctx, _, d = k_cache.shape
    return (d in FLASH_SHAPE and not softcap and not window and (max_keys or n_ctx) <= n_ctx
            and (scale is None or scale > 0))


def _flash_attention_cuda(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style, scale,
                          max_keys, freq_factors, attn_factor):
    """A prompt's attention_cached on tensor cores: ptx_transformer.flash_inputs (the
    caches appended, float16 q, k, v), then ptx_attention.flash_f16 reading the
    position on the device. Float16 inputs and output, as the prompt's products take."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    bound = max_keys or n_ctx
    table = rope_table(ctx, theta, d, n_ctx, freq_factors, attn_factor)
    q16 = ctx.empty((s, n_heads, d), np.float16)
    k16, v16 = (ctx.empty((bound, hkv, d), np.float16) for _ in range(2))
    ctx.launch(ptx_transformer.flash_inputs, (style == "neox",),
               [qkv, k_cache, v_cache, state, table, q16, k16, v16, s, n_heads, hkv, d, bound],
               ctx.stride_grid(s * (n_heads + 2 * hkv) * d + 2 * bound * hkv * d))
    out = ctx.empty((s, n_heads * d), np.float16)  # what the output product reads
    shape = FLASH_SHAPE[d]
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    ctx.launch(ptx_attention.flash_f16, (*shape, True, True),
               [q16, k16, v16, out, s, state, n_heads, hkv, scale * ptx_attention.LOG2E],
               (n_heads, -(-s // ptx_attention.flash_rows(shape[2])), 1), block=32 * shape[2])
    return out


def _attention_cached_matmul_quant_add_cuda(ctx, qkv, k_cache, v_cache, state, w, residual,
                                            n_heads=1, theta=10000.0, style="interleaved",
                                            scale=None, max_keys=None, qtype=3, k=0,
                                            lanes=None, freq_factors=None, attn_factor=1.0,
                                            softcap=0.0, window=0):
    half = prompt_takes(qkv.shape[0], k)  # attention writes what the product reads
    if half and _flash_takes(k_cache, max_keys, softcap, window, scale):
        attended = _flash_attention_cuda(ctx, qkv, k_cache, v_cache, state, n_heads, theta,
                                         style, scale, max_keys, freq_factors, attn_factor)
        return record_prompt_product(ctx, attended, w, qtype, k, residual=residual)
    attended = _attention_cached_cuda(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style,
                                      scale, max_keys, freq_factors, attn_factor, softcap,
                                      window, half=half)
    if half:
        return record_prompt_product(ctx, attended, w, qtype, k, residual=residual)
    return _matmul_quant_add_cuda(ctx, attended, w, residual, qtype, k, lanes)


@op(infer=_infer_cached_product, input_dtypes=("f32", "f32", "f32", "i32", "u8", "f32"),
    webgpu=_attention_cached_matmul_quant_add_webgpu, cpu=_attention_cached_matmul_quant_add_cpu,
    cuda=_attention_cached_matmul_quant_add_cuda)
def attention_cached_matmul_quant_add(qkv, k_cache, v_cache, state, w, residual, n_heads=1,
                                      theta=10000.0, style="interleaved", scale=None,
                                      max_keys=None, qtype=3, k=0, lanes=None,
                                      freq_factors=None, attn_factor=1.0, softcap=0.0,
                                      window=0, *, backend="auto"):
    """residual + attention_cached(qkv, caches, state, ...) @ W^T, W raw GGUF blocks: a
    layer's attention with its output projection (the caches are written in place)."""
    att = attention_cached.reference(qkv, k_cache, v_cache, state, n_heads, theta, style,
                                     scale, max_keys, freq_factors, attn_factor, softcap,
                                     window)
    return matmul_quant_add.reference(att, w, residual, qtype, k)
