"""norm.wgsl, attention_cached.wgsl, attention_prompt.wgsl, attention_paged.wgsl and
matmul_quant.wgsl for pxvm.ops.transformer.

The fused products are quantized.py's `product` with the norm, the residual's add or the
GLU in the same dispatch. One token's attention (decoding) runs attention_cached.wgsl's
`split` over ranges of the keys, a workgroup per (range, head), whose partial results
the output projection merges itself (ATTENTION_PARTS), so a layer's attention is two
dispatches however many keys it sees (three where many ranges meet a wide projection:
`combine` merges them once, PRODUCT_MERGES_MAX_WORK); a prompt's runs attention_prompt.wgsl (blocks of
tokens walking the keys in tiles: prompt_tiled_takes), or `split` and `combine`. KV
caches of float32 or float16 (two values a u32 word, unpacked in the kernels: their
F16_CACHE constant), any head size the op takes (even). A paged cache's batch
(attention_paged) runs attention_paged.wgsl: `append`, then `split` over key ranges and
`combine`, each token through its sequence's block table.
"""

from __future__ import annotations

import math

import numpy as np

from ....ops import transformer
from ....ops.normalization import rope_table
from ..runtime.params import KernelParams, f32, kernel_params, u32
from .layouts import AttentionPartials
from .normalization import NormParams
from .quantized import merged_values, product
from .subgroups import subgroup_variant

#: matmul_quant.wgsl's EPILOGUE for the residual's add and each GLU activation
ADD_EPILOGUE = 1
GLU_EPILOGUES = {"silu": 2, "gelu_tanh": 3}


@transformer.rmsnorm_matmul_quant.kernel("webgpu")
def rmsnorm_matmul_quant(ctx, x, gain, w, *, qtype, k, eps=1e-6):
    return product(ctx, x, w, w.shape[0], qtype, k, gain=gain, eps=eps)


@transformer.matmul_quant_add.kernel("webgpu")
def matmul_quant_add(ctx, x, w, residual, *, qtype, k):
    return product(ctx, x, w, w.shape[0], qtype, k, residual=residual, epilogue=ADD_EPILOGUE)


@transformer.rmsnorm_glu_quant.kernel("webgpu")
def rmsnorm_glu_quant(ctx, x, gain, w, *, qtype, k, eps=1e-6, activation="silu"):
    return product(ctx, x, w, w.shape[0] // 2, qtype, k, gain=gain, eps=eps,
                   epilogue=GLU_EPILOGUES[activation])


@transformer.qk_norm.kernel("webgpu")
def qk_norm(ctx, qkv, q_gain, k_gain, n_heads=1, n_kv_heads=1, eps=1e-6):
    out = ctx.empty(qkv.shape, np.float32)
    d = q_gain.shape[0]
    rows = qkv.size // d
    ctx.dispatch("norm.wgsl", "qk_norm", [qkv, q_gain, k_gain, out],
                 NormParams(rows, d, float(eps)), rows,
                 {"Q_HEADS": n_heads, "KV_HEADS": n_kv_heads})
    return out


CACHED_KERNEL = "attention_cached.wgsl"
#: attention_cached.wgsl with its reductions by subgroup operations (subgroups.py)
CACHED_SUBGROUP_KERNEL = "attention_cached_subgroups.wgsl"
CACHED_CHUNK = 64  # keys per trip of attention_cached.wgsl's `split` (its CHUNK)
assert transformer.RING_ROWS % CACHED_CHUNK == 0  # a ring cache is walked in whole chunks
# The keys a token may see are cut into at most CACHED_MAX_RANGES ranges, one workgroup
# each per (token, head); their results are merged by `combine` or by the output
# projection. Bounds of at most CACHED_ONE_RANGE_MAX_KEYS keys take one range, which
# needs no merge: `attention_cached` then runs in one dispatch. Both were chosen on the
# H100 with SmolLM2's decoding step (docs/benchmarks-log.md, "attention ranges").
CACHED_MAX_RANGES = 16
CACHED_ONE_RANGE_MAX_KEYS = 64
# Every workgroup of the output projection merges its token's ranges again: for one
# token (a decoding step) that costs less than a `combine` pass and the wait for it, for
# a prompt's many tokens more (measured with a 512-token prefill on the H100).
PRODUCT_MERGES_MAX_TOKENS = 1
# .. while ranges x the projection's output columns stay within this: each of its
# workgroups merges every range again. SmolLM2's 576 columns at 16 ranges (the H100's
# choice); on the H200 at depth 4096 (16 ranges) Llama 3.2 1B's 2048 columns and 3.1 8B's
# 4096 decoded 1.35x and 1.65x faster with the pass (docs/benchmarks-log.md).
PRODUCT_MERGES_MAX_WORK = 16 * 576


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


def prompt_tiled_takes(tokens: int, head_dim: int, ring: bool, half: bool = False) -> bool:
    """Whether attention_cached of `tokens` new tokens runs attention_prompt.wgsl (the
    tiled prompt attention) on WebGPU: a prompt of at least PROMPT_TILED_MIN_TOKENS
    tokens over a cache that is not a ring, with a head size of whole 16-byte units (the
    kernel loads a row 16 bytes at a time: four float32 values, or eight float16 ones
    where the cache is float16, `half`)."""
    unit = 8 if half else 4
    return tokens >= PROMPT_TILED_MIN_TOKENS and not ring and head_dim % unit == 0


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
    half = _half_cache(k_cache)
    constants = {"NEOX": int(style == "neox"), "F16_CACHE": int(half), "HEAD_DIM": d,
                 "QUERY_ROWS": rows, "TILE_KEYS": keys}
    words = s * hkv * d // (2 if half else 1)  # `append`'s threads: a word of the caches each
    ctx.dispatch(PROMPT_KERNEL, "append", tensors, params, -(-words // PROMPT_WG), constants)
    ctx.dispatch(PROMPT_KERNEL, "tiled", tensors, params, (-(-s // rows), params.hq, 1),
                 constants)
    return out


def _half_cache(k_cache) -> bool:
    """Whether the caches are float16 (their kernels' F16_CACHE); float32 otherwise."""
    return np.dtype(k_cache.dtype) == np.float16


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
    half = _half_cache(k_cache)
    if prompt_tiled_takes(s, d, bound > n_ctx, half):
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
    constants = {"NEOX": int(style == "neox"), "RING": int(bound > n_ctx),
                 "F16_CACHE": int(half), "HEAD_DIM": d, **partials.constants()}
    kernel = subgroup_variant(ctx, CACHED_KERNEL, CACHED_SUBGROUP_KERNEL)
    ctx.dispatch(kernel, "split", tensors, params, (n_ranges, n_heads, s), constants)
    if n_ranges == 1:
        return out, None, None

    def combine():
        ctx.dispatch(kernel, "combine", tensors, params, (n_heads, s, 1), constants)
        return out

    return part, partials, combine


@transformer.attention_cached.kernel("webgpu")
def attention_cached(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                     style="interleaved", scale=None, max_keys=None, freq_factors=None,
                     attn_factor=1.0, softcap=0.0, window=0):
    result, _, combine = _attend(ctx, qkv, k_cache, v_cache, state,
                                 max_keys or k_cache.shape[0], n_heads, theta, style, scale,
                                 freq_factors, attn_factor, softcap, window)
    return result if combine is None else combine()


@transformer.attention_cached_matmul_quant_add.kernel("webgpu")
def attention_cached_matmul_quant_add(ctx, qkv, k_cache, v_cache, state, w, residual, *,
                                      qtype, k, n_heads=1, theta=10000.0, style="interleaved",
                                      scale=None, max_keys=None, freq_factors=None,
                                      attn_factor=1.0, softcap=0.0, window=0):
    n_ctx, _, d = k_cache.shape
    result, partials, combine = _attend(ctx, qkv, k_cache, v_cache, state, max_keys or n_ctx,
                                        n_heads, theta, style, scale, freq_factors,
                                        attn_factor, softcap, window)
    tokens = qkv.shape[0]
    if (combine is None or tokens > PRODUCT_MERGES_MAX_TOKENS or n_heads * d > merged_values(ctx)
            or partials.n_ranges * w.shape[0] > PRODUCT_MERGES_MAX_WORK):
        attended = result if combine is None else combine()
        return product(ctx, attended, w, w.shape[0], qtype, k, residual=residual,
                       epilogue=ADD_EPILOGUE)
    return product(ctx, result, w, w.shape[0], qtype, k, residual=residual,
                   epilogue=ADD_EPILOGUE, rows=tokens, merge=(state, partials))


# ---- attention over a paged KV cache (continuous batching) ----------------------------
# attention_paged.wgsl: `append` writes every token's key and value into its pool row,
# then `split` over ranges of each token's keys (paged_key_ranges of the most keys a
# token of the table may see), merged by `combine` where there are several: a batch of
# decoding tokens of long sequences is many workgroups a token.
PAGED_KERNEL = "attention_paged.wgsl"
#: attention_paged.wgsl with its reductions by subgroup operations (subgroups.py)
PAGED_SUBGROUP_KERNEL = "attention_paged_subgroups.wgsl"
PAGED_WG = 256  # attention_paged.wgsl's WG
# Partial results (a record a token, query head and range) a batch at most: a batch of
# many tokens takes fewer, longer ranges (its tokens and heads fill the GPU by
# themselves), so that a prompt's chunk does not make partials of hundreds of MB.
# 2**16 records of heads of 128 are 34 MB; 64 decoding tokens of 32 heads take 16 ranges.
PAGED_MAX_PARTIALS = 1 << 16


def paged_key_ranges(keys: int, tokens: int, heads: int) -> tuple[int, int]:
    """(ranges, keys per range) of attention_paged.wgsl's `split` for tokens seeing at
    most `keys` keys: cached_key_ranges', in at most PAGED_MAX_PARTIALS / (tokens *
    heads) ranges a token."""
    most = min(CACHED_MAX_RANGES, PAGED_MAX_PARTIALS // (tokens * heads))
    if keys <= CACHED_ONE_RANGE_MAX_KEYS or most <= 1:
        return 1, -(-keys // CACHED_CHUNK) * CACHED_CHUNK
    range_len = CACHED_CHUNK * -(-keys // (CACHED_CHUNK * most))
    return -(-keys // range_len), range_len


@kernel_params(PAGED_KERNEL, PAGED_SUBGROUP_KERNEL)
class PagedAttentionParams(KernelParams):
    t: u32           # tokens (rows of qkv and of the token table)
    hq: u32
    hkv: u32
    block_size: u32  # rows of a pool block
    n_blocks: u32    # blocks of the pools
    seqs: u32        # sequences of the block table (its rows)
    max_blocks: u32  # blocks a sequence at most (the block table's columns)
    n_ranges: u32    # key ranges a token in the grid (and in the partials)
    range_len: u32   # keys a range, a multiple of CACHED_CHUNK
    scale: f32
    softcap: f32     # scores become softcap * tanh(score / softcap); 0: not capped
    window: u32      # a token sees its last `window` keys (itself included); 0: all


@transformer.attention_paged.kernel("webgpu")
def attention_paged(ctx, qkv, k_pool, v_pool, token_table, block_table, n_heads=1,
                    theta=10000.0, style="interleaved", scale=None, freq_factors=None,
                    attn_factor=1.0, softcap=0.0, window=0):
    n_blocks, block_size, hkv, d = k_pool.shape
    tokens = qkv.shape[0]
    seqs, max_blocks = block_table.shape
    positions = max_blocks * block_size  # the most a sequence's table holds
    # the most keys a token sees: its ranges start at its first
    n_ranges, range_len = paged_key_ranges(min(window, positions) if window else positions,
                                           tokens, n_heads)
    partials = AttentionPartials(d, n_ranges, range_len, positions)
    part = ctx.empty((1 if n_ranges == 1 else tokens * n_heads * n_ranges, partials.stride),
                     np.float32, "attention partial sums")
    out = ctx.empty((tokens, n_heads * d), np.float32)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    table = rope_table(ctx, theta, d, positions, freq_factors, attn_factor)
    tensors = [qkv, k_pool, v_pool, token_table, block_table, table, part, out]
    params = PagedAttentionParams(tokens, n_heads, hkv, block_size, n_blocks, seqs, max_blocks,
                                  n_ranges, range_len, scale, float(softcap), int(window))
    half = _half_cache(k_pool)
    constants = {"NEOX": int(style == "neox"), "F16_CACHE": int(half), "HEAD_DIM": d,
                 **partials.constants()}
    kernel = subgroup_variant(ctx, PAGED_KERNEL, PAGED_SUBGROUP_KERNEL)
    words = tokens * hkv * d // (2 if half else 1)  # `append`'s threads: a word of the pools each
    ctx.dispatch(kernel, "append", tensors, params, -(-words // PAGED_WG), constants)
    ctx.dispatch(kernel, "split", tensors, params, (n_ranges, n_heads, tokens), constants)
    if n_ranges > 1:
        ctx.dispatch(kernel, "combine", tensors, params, (n_heads, tokens, 1), constants)
    return out
