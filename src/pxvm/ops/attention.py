"""Multi-head attention (attention.wgsl) with grouped-query heads and a causal mask
offset for KV caches: query i of Sq sees keys j <= i + Skv - Sq. Few queries over many
keys (decoding) split the keys over several workgroups and merge the partial results.

`attention_cached` (attention_cached.wgsl) is the transformer's whole attention step
over a KV cache: rotary embedding, appending the new keys and values, attending. It
reads the position from a state tensor on the device, so a recorded decoding step is
valid at every position. `attention_cached_matmul_quant_add` adds the output projection
and the residual: for a decoding step its product merges attention's per-range results
itself, so a layer's attention takes two dispatches however many keys it sees."""

from __future__ import annotations

import math

import numpy as np

from .normalization import rope_ref, rope_table
from .quantized import MAX_MERGED, matmul_quant_add, matmul_quant_add_ref, record_product
from .registry import meta, register, require

KERNEL = "attention.wgsl"
MAX_HEAD_DIM = 256
# Key splitting (decoding with a long KV cache): below SPLIT_MAX_TASKS (query, head)
# pairs a one-workgroup-per-pair pass cannot fill a large GPU (132 SMs on an H100), so
# runs of at least SPLIT_MIN_KEYS keys are cut into ranges of SPLIT_LEN keys each.
SPLIT_MAX_TASKS = 512
SPLIT_MIN_KEYS = 1024
SPLIT_LEN = 512


def attention_ref(q, k, v, causal=True, scale=None):
    """softmax(q k^T * scale + mask) v per head; q (Sq, Hq, D), k/v (Skv, Hkv, D)."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    group = hq // hkv
    kk = np.repeat(k, group, axis=1)  # (Skv, Hq, D)
    vv = np.repeat(v, group, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, kk) * scale
    if causal:
        allowed = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, vv).astype(np.float32)


def _infer(q, k, v, causal=True, scale=None):
    require(len(q.shape) == 3 and len(k.shape) == 3 and len(v.shape) == 3,
            f"attention takes q (Sq, Hq, D), k and v (Skv, Hkv, D); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}")
    require(tuple(k.shape) == tuple(v.shape), f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    sq, hq, d = q.shape
    skv, hkv, dk = k.shape
    require(d == dk, f"head dimension of q ({d}) and k ({dk}) differ")
    require(hkv >= 1 and hq % hkv == 0,
            f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    require(1 <= d <= MAX_HEAD_DIM, f"head dimension must be 1..{MAX_HEAD_DIM}, got {d}")
    require(sq >= 1 and skv >= 1, "attention needs at least one query and one key")
    require(not causal or skv >= sq,
            f"causal attention needs at least as many keys ({skv}) as queries ({sq})")
    return meta(q.shape, np.float32)


def split_plan(sq: int, hq: int, skv: int) -> int:
    """Key ranges per (query, head): 1 (one pass) unless few (query, head) pairs meet
    many keys, where splitting the keys gives the GPU enough workgroups."""
    if sq * hq >= SPLIT_MAX_TASKS or skv < SPLIT_MIN_KEYS:
        return 1
    return -(-skv // SPLIT_LEN)


def attention_gpu(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = ctx.empty(q.shape, np.float32)
    n_split = split_plan(sq, hq, skv)
    params = (sq, skv, hq, hkv, d, scale, n_split, SPLIT_LEN)
    consts = {"CAUSAL": int(bool(causal))}
    if n_split == 1:
        stand_in = ctx.empty((1,), np.float32, "attention stand-in")
        ctx.dispatch(KERNEL, "main", [q, k, v, out, stand_in], params, sq * hq, consts)
    else:
        part = ctx.empty((sq * hq * n_split, d + 2), np.float32, "attention partial sums")
        ctx.dispatch(KERNEL, "split_keys", [q, k, v, out, part], params,
                     sq * hq * n_split, consts)
        ctx.dispatch(KERNEL, "combine", [q, k, v, out, part], params, sq * hq, consts)
    return out


attention = register("attention", 3, attention_ref, attention_gpu, _infer)

CACHED_KERNEL = "attention_cached.wgsl"
CACHED_CHUNK = 64  # keys per trip of attention_cached.wgsl's `split` (its CHUNK)
# The keys a token may see are cut into at most CACHED_MAX_RANGES ranges, one workgroup
# each per (token, head); their results are merged by `combine` or by the output
# projection. Bounds of at most CACHED_ONE_RANGE_MAX_KEYS keys take one range, which
# needs no merge: `attention_cached` then runs in one dispatch. On the H100 (SmolLM2's
# decoding step, benchmarks/h100/tree_ab.py) one 64-key range beat four merged ones by
# 40 us at position 0, but one range over 256 keys (four chunks in turn) lost to four
# ranges by 120-230 us at positions 128-255. Every thread reading the chunk's scores for
# the max and sum itself, instead of the reductions, cost 120 us at positions 64-255
# and 640 at 2,000.
CACHED_MAX_RANGES = 16
CACHED_ONE_RANGE_MAX_KEYS = 64
# Every workgroup of the output projection merges its token's ranges again: for one
# token (a decoding step) that costs less than a `combine` pass and the wait for it, for
# a prompt's many tokens more (SmolLM2's shapes on the H100, 512-token prefill: 4,973 and
# 5,036 tokens/s merged in the product, 5,172 and 5,436 with combine).
PRODUCT_MERGES_MAX_TOKENS = 1


def cached_key_ranges(bound: int):
    """(ranges, keys per range) covering `bound` keys: one range up to
    CACHED_ONE_RANGE_MAX_KEYS keys, else the fewest chunk-aligned ranges of equal length,
    at most CACHED_MAX_RANGES."""
    chunk = CACHED_CHUNK
    if bound <= CACHED_ONE_RANGE_MAX_KEYS:
        return 1, -(-bound // chunk) * chunk
    range_len = chunk * -(-bound // (chunk * CACHED_MAX_RANGES))
    return -(-bound // range_len), range_len


def attention_cached_ref(qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                         style="interleaved", scale=None, max_keys=None):
    """Attention of S new tokens at positions pos.. (pos = state[1]) over a KV cache.

    qkv (S, (n_heads + 2 Hkv) D) holds each token's query heads, key heads and value
    heads; caches are (n_ctx, Hkv, D). Queries and keys get the rotary embedding at their
    positions, the new keys and values are written into the caches at rows pos..pos+S-1
    (in place), and each query attends causally to cache rows 0..its own position.
    Returns (S, n_heads * D).

    `max_keys` (default n_ctx) bounds the GPU's grid, so positions must keep
    pos + S <= max_keys. Here that is checked; the GPU reads pos on the device, where no
    error can be raised, so it returns NaN rows for tokens beyond the bound instead of
    attending over part of their keys."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    pos = int(np.asarray(state).reshape(-1)[1])
    require(0 <= pos and pos + s <= n_ctx,
            f"attention_cached: positions {pos}..{pos + s - 1} are outside the cache of "
            f"{n_ctx} rows")
    require(max_keys is None or pos + s <= max_keys,
            f"attention_cached: positions {pos}..{pos + s - 1} reach beyond max_keys="
            f"{max_keys}; record with a larger max_keys")
    q, k, v = np.split(np.asarray(qkv, np.float32), [n_heads * d, (n_heads + hkv) * d], axis=1)
    q = rope_ref(q.reshape(s, n_heads, d), pos, theta, style)
    k_cache[pos: pos + s] = rope_ref(k.reshape(s, hkv, d), pos, theta, style)
    v_cache[pos: pos + s] = v.reshape(s, hkv, d)
    out = attention_ref(q, k_cache[: pos + s], v_cache[: pos + s], causal=True, scale=scale)
    return out.reshape(s, n_heads * d)


def _infer_cached(qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                  style="interleaved", scale=None, max_keys=None):
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
    require(style in ("interleaved", "neox"), f"unknown rope style {style!r}")
    require(max_keys is None or qkv.shape[0] <= max_keys <= n_ctx,
            f"max_keys must be in {qkv.shape[0]}..{n_ctx}, got {max_keys}")
    return meta((qkv.shape[0], n_heads * d), np.float32)


def _attend(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style, scale, bound):
    """Record `split` over keys below `bound`: with one range it returns (the attention
    output, None), else (the ranges' partial results, (ranges, keys per range, a function
    that records `combine` and returns the output)), leaving the merge to the caller."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    n_ranges, range_len = cached_key_ranges(bound)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    table = rope_table(ctx, theta, d, n_ctx)
    part = ctx.empty((1 if n_ranges == 1 else s * n_heads * n_ranges, d + 2), np.float32,
                     "attention partial sums")
    out = ctx.empty((s, n_heads * d), np.float32)
    tensors = [qkv, k_cache, v_cache, state, table, part, out]
    params = (s, n_heads, hkv, n_ctx, n_ranges, range_len, bound, scale)
    consts = {"NEOX": int(style == "neox"), "HEAD_DIM": d}
    ctx.dispatch(CACHED_KERNEL, "split", tensors, params, (n_ranges, n_heads, s), consts)
    if n_ranges == 1:
        return out, None

    def combine():
        ctx.dispatch(CACHED_KERNEL, "combine", tensors, params, (n_heads, s, 1), consts)
        return out

    return part, (n_ranges, range_len, combine)


def attention_cached_gpu(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                         style="interleaved", scale=None, max_keys=None):
    result, ranges = _attend(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style,
                             scale, max_keys or k_cache.shape[0])
    return result if ranges is None else ranges[2]()


attention_cached = register("attention_cached", 4, attention_cached_ref, attention_cached_gpu,
                            _infer_cached, input_dtypes=("f32", "f32", "f32", "i32"))


def attention_cached_matmul_quant_add_ref(qkv, k_cache, v_cache, state, w, residual, n_heads=1,
                                          theta=10000.0, style="interleaved", scale=None,
                                          max_keys=None, qtype=3, k=0, lanes=None):
    """residual + attention_cached(qkv, caches, state, ...) @ W^T, W raw GGUF blocks: a
    layer's attention with its output projection (the caches are written in place)."""
    att = attention_cached_ref(qkv, k_cache, v_cache, state, n_heads, theta, style, scale,
                               max_keys)
    return matmul_quant_add_ref(att, w, residual, qtype, k)


def _infer_cached_product(qkv, k_cache, v_cache, state, w, residual, n_heads=1, theta=10000.0,
                          style="interleaved", scale=None, max_keys=None, qtype=3, k=0,
                          lanes=None):
    att = _infer_cached(qkv, k_cache, v_cache, state, n_heads, theta, style, scale, max_keys)
    require(k == att.shape[1], f"attention_cached_matmul_quant_add: the output projection "
            f"takes the attention output, K = n_heads * head dim = {att.shape[1]}; got k={k}")
    return matmul_quant_add.infer([att, w, residual], {"qtype": qtype, "k": k, "lanes": lanes})


def attention_cached_matmul_quant_add_gpu(ctx, qkv, k_cache, v_cache, state, w, residual,
                                          n_heads=1, theta=10000.0, style="interleaved",
                                          scale=None, max_keys=None, qtype=3, k=0, lanes=None):
    n_ctx, _, d = k_cache.shape
    bound = max_keys or n_ctx
    result, ranges = _attend(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style, scale,
                             bound)
    if (ranges is None or qkv.shape[0] > PRODUCT_MERGES_MAX_TOKENS
            or n_heads * d > MAX_MERGED):
        att = result if ranges is None else ranges[2]()
        return record_product(ctx, att, w, w.shape[0], qtype, k, residual=residual,
                              lanes=lanes, epilogue=1)
    merge = (state, d, ranges[0], ranges[1], bound)
    return record_product(ctx, result, w, w.shape[0], qtype, k, residual=residual,
                          lanes=lanes, epilogue=1, rows=qkv.shape[0], attention=merge)


attention_cached_matmul_quant_add = register(
    "attention_cached_matmul_quant_add", 6, attention_cached_matmul_quant_add_ref,
    attention_cached_matmul_quant_add_gpu, _infer_cached_product,
    input_dtypes=("f32", "f32", "f32", "i32", "u8", "f32"))
