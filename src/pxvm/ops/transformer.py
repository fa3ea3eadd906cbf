"""Fused ops for a transformer layer, each named for what it computes, and each equal to
a few primitive ops (its `decomposition`), which a backend without the fused kernel
runs instead:

- `rmsnorm_matmul_quant`: rmsnorm(x) @ W^T (the norm, then the Q/K/V or LM-head product)
- `rmsnorm_glu_quant`: act(h Wg^T) * (h Wu^T) with h = rmsnorm(x), act silu or GELU (the
  feed-forward's first half: SwiGLU or GeGLU)
- `matmul_quant_add`: residual + x @ W^T (the down projection with its residual)
- `qk_norm`: each query and key head of a projected qkv RMS-normalised (Qwen3, Gemma 3)
- `attention_cached`: RoPE, appending the new keys and values to the KV cache, and
  causal attention over it, at a position read from a state tensor on the device, so a
  recorded decoding step is valid at every position. It has no decomposition: the
  primitive ops take positions from the host.
- `attention_cached_matmul_quant_add`: residual + attention_cached(...) @ Wo^T.
- `attention_paged`: attention_cached for a batch of sequences whose caches are blocks
  of one pool, through a block table (continuous batching).

KV caches are float32 or float16 (KV_CACHE_DTYPES; both caches alike): a float16 cache
stores the new keys and values rounded to float16 (to nearest even), and attention reads
them back as the float32 values they are; its math is the same. Half the bytes per
decoded token, whose attention reads the whole cache. `cache_dtypes` says which dtypes a
backend's attention kernels take.

Weights are raw GGUF blocks (quantized.py); references are the unfused ops' references.
"""

from __future__ import annotations

import math

import numpy as np

from .attention import MAX_HEAD_DIM, attention
from .elementwise import add, gelu_tanh, mul, silu
from .indexing import concat_columns, slice_columns
from .normalization import check_rope, rmsnorm, rope
from .quantized import infer_product, matmul_quant
from .registry import meta, op, require

# ---- fused products -------------------------------------------------------------------
WEIGHT_INPUTS = ("f32", "f32", "u8")  # x, gain, W
#: The gated feed-forwards' activations (applied to the gate): SwiGLU's and GeGLU's.
GLU_ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}


def _infer_norm_product(x, gain, w, *, qtype, k, eps=1e-6):
    require(tuple(gain.shape) == (k,), f"the norm's gain must have shape ({k},), got "
            f"{tuple(gain.shape)}")
    return infer_product(x, w, qtype=qtype, k=k)


def _norm_then_product(x, gain, w, *, qtype, k, eps=1e-6):
    return matmul_quant(rmsnorm(x, gain, eps=eps), w, qtype=qtype, k=k)


@op(infer=_infer_norm_product, input_dtypes=WEIGHT_INPUTS, decomposition=_norm_then_product)
def rmsnorm_matmul_quant(x, gain, w, *, qtype, k, eps=1e-6, backend="auto"):
    """rmsnorm(x, gain, eps) @ W^T for W stored as raw GGUF blocks."""
    return matmul_quant.reference(rmsnorm.reference(x, gain, eps), w, qtype=qtype, k=k)


def _infer_product_add(x, w, residual, *, qtype, k):
    m = infer_product(x, w, qtype=qtype, k=k)
    require(tuple(residual.shape) == m.shape,
            f"matmul_quant_add: the residual must have shape {m.shape}, got {tuple(residual.shape)}")
    return m


def _product_then_add(x, w, residual, *, qtype, k):
    return add(residual, matmul_quant(x, w, qtype=qtype, k=k))


@op(infer=_infer_product_add, input_dtypes=("f32", "u8", "f32"),
    decomposition=_product_then_add)
def matmul_quant_add(x, w, residual, *, qtype, k, backend="auto"):
    """residual + x @ W^T for W stored as raw GGUF blocks."""
    return np.asarray(np.asarray(residual, np.float32)
                      + matmul_quant.reference(x, w, qtype=qtype, k=k), np.float32)


def _infer_glu(x, gain, w, *, qtype, k, eps=1e-6, activation="silu"):
    m = _infer_norm_product(x, gain, w, qtype=qtype, k=k, eps=eps)
    require(w.shape[0] % 2 == 0, f"rmsnorm_glu_quant: W must stack the gate and up rows "
            f"(an even row count), got {w.shape[0]} rows")
    require(activation in GLU_ACTIVATIONS, f"rmsnorm_glu_quant: activation must be one of "
            f"{', '.join(GLU_ACTIVATIONS)}, got {activation!r}")
    return meta((m.shape[0], m.shape[1] // 2), np.float32)


def _norm_product_then_glu(x, gain, w, *, qtype, k, eps=1e-6, activation="silu"):
    both = _norm_then_product(x, gain, w, qtype=qtype, k=k, eps=eps)
    f = w.shape[0] // 2
    act = GLU_ACTIVATIONS[activation]
    return mul(act(slice_columns(both, 0, f)), slice_columns(both, f, 2 * f))


@op(infer=_infer_glu, input_dtypes=WEIGHT_INPUTS, decomposition=_norm_product_then_glu)
def rmsnorm_glu_quant(x, gain, w, *, qtype, k, eps=1e-6, activation="silu",
                      backend="auto"):
    """act(h @ Wg^T) * (h @ Wu^T), h = rmsnorm(x, gain, eps), for W = [Wg; Wu] (2F rows
    of raw GGUF blocks: the gate's F rows, then the up projection's F rows); act is silu
    (SwiGLU) or gelu_tanh (GeGLU)."""
    both = matmul_quant.reference(rmsnorm.reference(x, gain, eps), w, qtype=qtype, k=k)
    f = w.shape[0] // 2
    act = GLU_ACTIVATIONS[activation]
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


def _heads_normed(qkv, q_gain, k_gain, n_heads=1, n_kv_heads=1, eps=1e-6):
    s, d = qkv.shape[0], q_gain.shape[0]
    q_end, k_end = n_heads * d, (n_heads + n_kv_heads) * d

    def normed(start, stop, heads, gain):  # the heads as rows of d values, normed
        rows = slice_columns(qkv, start, stop).reshape(s * heads, d)
        return rmsnorm(rows, gain, eps=eps).reshape(s, heads * d)
    q = normed(0, q_end, n_heads, q_gain)
    keys = normed(q_end, k_end, n_kv_heads, k_gain)
    return concat_columns(concat_columns(q, keys), slice_columns(qkv, k_end, qkv.shape[1]))


@op(infer=_infer_qk_norm, input_dtypes=("f32", "f32", "f32"), decomposition=_heads_normed)
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
#: A cache of fewer rows than positions (a sliding window's) holds them as a ring of a
#: multiple of RING_ROWS rows (the kernels walk keys in chunks of it).
RING_ROWS = 64
#: The KV caches' dtypes, by name: float32, or float16 (half the bytes to read)
KV_CACHE_DTYPES = {"f32": np.dtype(np.float32), "f16": np.dtype(np.float16)}
CACHE_INPUTS = ("f32", tuple(KV_CACHE_DTYPES), tuple(KV_CACHE_DTYPES), "i32")


def _check_attention(name: str, qkv, k_cache, v_cache, layout: str, n_heads, style,
                     freq_factors, attn_factor, softcap, window) -> None:
    """ShapeError unless the caches (or pools) are alike, their shape ends in (Hkv, D)
    that n_heads and qkv fit, and the rotation, cap and window are valid."""
    rank = len(layout.split(","))
    require(len(k_cache.shape) == rank and tuple(k_cache.shape) == tuple(v_cache.shape),
            f"{name}: {'caches' if rank == 3 else 'pools'} must both be ({layout}), got "
            f"{tuple(k_cache.shape)} and {tuple(v_cache.shape)}")
    require(np.dtype(k_cache.dtype) == np.dtype(v_cache.dtype),
            f"{name}: the {'caches' if rank == 3 else 'pools'} must have one dtype, got "
            f"{np.dtype(k_cache.dtype)} keys and {np.dtype(v_cache.dtype)} values")
    hkv, d = k_cache.shape[-2:]
    require(n_heads >= 1 and n_heads % hkv == 0,
            f"query heads ({n_heads}) must be a multiple of key/value heads ({hkv})")
    require(d % 2 == 0 and 2 <= d <= MAX_HEAD_DIM,
            f"head dimension must be even and at most {MAX_HEAD_DIM}, got {d}")
    require(len(qkv.shape) == 2 and qkv.shape[1] == (n_heads + 2 * hkv) * d and qkv.shape[0] >= 1,
            f"{name}: qkv must be ({'S' if rank == 3 else 'T'}, {(n_heads + 2 * hkv) * d}) for "
            f"{n_heads} query heads and {hkv} key/value heads of {d}, got {tuple(qkv.shape)}")
    check_rope(d, style, freq_factors, attn_factor)
    require(math.isfinite(softcap) and softcap >= 0,
            f"attention softcap must be finite and at least 0 (0: none), got {softcap}")
    require(isinstance(window, (int, np.integer)) and 0 <= window < 2**32,
            f"attention window must be a count of keys (0: all), got {window!r}")


def _infer_cached(qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                  style="interleaved", scale=None, max_keys=None, freq_factors=None,
                  attn_factor=1.0, softcap=0.0, window=0):
    _check_attention("attention_cached", qkv, k_cache, v_cache, "n_ctx, Hkv, D", n_heads,
                     style, freq_factors, attn_factor, softcap, window)
    require(np.dtype(state.dtype) == np.int32 and state.size >= 2,
            "attention_cached: state must be an int32 tensor [token, position, ...]")
    n_ctx, _, d = k_cache.shape
    s = qkv.shape[0]
    if max_keys is not None and max_keys > n_ctx and window > 0:  # a ring (cached_rows)
        require(n_ctx % RING_ROWS == 0 and n_ctx >= window + s - 1,
                f"attention_cached: max_keys={max_keys} is beyond the cache's {n_ctx} rows, "
                f"which holds positions as a ring only in {RING_ROWS}-row multiples of at "
                f"least window + new tokens - 1 = {window + s - 1} rows")
    else:
        require(max_keys is None or s <= max_keys <= n_ctx,
                f"max_keys must be in {s}..{n_ctx} (beyond the cache only with a window), "
                f"got {max_keys}")
    return meta((s, n_heads * d), np.float32)


def cached_rows(window: int, new_tokens: int, positions: int) -> int:
    """Rows of a KV cache for `positions` positions: all of them, or for a sliding window
    fewer, as a ring (attention_cached's): the window and one pass's new tokens, in whole
    RING_ROWS."""
    if not window:
        return positions
    ring = -(-(window + new_tokens - 1) // RING_ROWS) * RING_ROWS
    return min(ring, positions)


def cache_dtypes(backend) -> list[str]:
    """The KV cache dtypes (KV_CACHE_DTYPES' names) that attention_cached and
    attention_cached_matmul_quant_add both take on `backend` (Op.takes)."""
    return [name for name, dtype in KV_CACHE_DTYPES.items()
            if all(o.takes(backend, {"k_cache": dtype, "v_cache": dtype})
                   for o in (attention_cached, attention_cached_matmul_quant_add))]


@op(infer=_infer_cached, input_dtypes=CACHE_INPUTS)
def attention_cached(qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                     style="interleaved", scale=None, max_keys=None, freq_factors=None,
                     attn_factor=1.0, softcap=0.0, window=0, *, backend="auto"):
    """Attention of S new tokens at positions pos.. (pos = state[1]) over a KV cache.

    qkv (S, (n_heads + 2 Hkv) D) holds each token's query heads, key heads and value
    heads; caches are (n_ctx, Hkv, D), float32 or float16. Queries and keys get the rotary
    embedding at their positions, the new keys and values are written into the caches at
    rows pos..pos+S-1 (in place; rounded to float16 in a float16 cache, and read back so
    by the attention), and each query attends causally to cache rows 0..its own position (its
    last `window` rows when window > 0: sliding-window attention). With a window, the
    caches may be rings (cached_rows): position j in row j % n_ctx, max_keys beyond n_ctx.
    Scores are q.k * scale (default 1/sqrt(D)), capped to softcap * tanh(score / softcap)
    when softcap > 0; freq_factors and attn_factor change the rotation as in `rope`.
    Returns (S, n_heads * D).

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
    # stored in the caches' dtype (float16: rounded to nearest even); everything after
    # reads the stored values
    k_cache[new_rows] = rope.reference(k.reshape(s, hkv, d), pos, **turn)
    v_cache[new_rows] = v.reshape(s, hkv, d)
    if not softcap and not window:
        out = attention.reference(q, np.asarray(k_cache[: pos + s], np.float32),
                                  np.asarray(v_cache[: pos + s], np.float32), causal=True,
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


def _infer_cached_product(qkv, k_cache, v_cache, state, w, residual, *, qtype, k, n_heads=1,
                          theta=10000.0, style="interleaved", scale=None, max_keys=None,
                          freq_factors=None, attn_factor=1.0, softcap=0.0, window=0):
    att = _infer_cached(qkv, k_cache, v_cache, state, n_heads, theta, style, scale, max_keys,
                        freq_factors, attn_factor, softcap, window)
    require(k == att.shape[1], f"attention_cached_matmul_quant_add: the output projection "
            f"takes the attention output, K = n_heads * head dim = {att.shape[1]}; got k={k}")
    return matmul_quant_add.infer([att, w, residual], {"qtype": qtype, "k": k})


def _attention_then_product(qkv, k_cache, v_cache, state, w, residual, *, qtype, k,
                            n_heads=1, theta=10000.0, style="interleaved", scale=None,
                            max_keys=None, freq_factors=None, attn_factor=1.0, softcap=0.0,
                            window=0):
    att = attention_cached(qkv, k_cache, v_cache, state, n_heads=n_heads, theta=theta,
                           style=style, scale=scale, max_keys=max_keys,
                           freq_factors=freq_factors, attn_factor=attn_factor,
                           softcap=softcap, window=window)
    return matmul_quant_add(att, w, residual, qtype=qtype, k=k)


@op(infer=_infer_cached_product, input_dtypes=(*CACHE_INPUTS, "u8", "f32"),
    decomposition=_attention_then_product)
def attention_cached_matmul_quant_add(qkv, k_cache, v_cache, state, w, residual, *, qtype,
                                      k, n_heads=1, theta=10000.0, style="interleaved",
                                      scale=None, max_keys=None, freq_factors=None,
                                      attn_factor=1.0, softcap=0.0, window=0,
                                      backend="auto"):
    """residual + attention_cached(qkv, caches, state, ...) @ W^T, W raw GGUF blocks: a
    layer's attention with its output projection (the caches are written in place)."""
    att = attention_cached.reference(qkv, k_cache, v_cache, state, n_heads, theta, style,
                                     scale, max_keys, freq_factors, attn_factor, softcap,
                                     window)
    return matmul_quant_add.reference(att, w, residual, qtype=qtype, k=k)


# ---- attention over a paged KV cache (continuous batching) ----------------------------
def _infer_paged(qkv, k_pool, v_pool, token_table, block_table, n_heads=1, theta=10000.0,
                 style="interleaved", scale=None, freq_factors=None, attn_factor=1.0,
                 softcap=0.0, window=0):
    _check_attention("attention_paged", qkv, k_pool, v_pool, "blocks, block_size, Hkv, D",
                     n_heads, style, freq_factors, attn_factor, softcap, window)
    t, d = qkv.shape[0], k_pool.shape[3]
    require(np.dtype(token_table.dtype) == np.int32 and tuple(token_table.shape) == (t, 2),
            f"attention_paged: token_table must be int32 (T, 2) = [sequence, position] per "
            f"token, T = {t}; got {np.dtype(token_table.dtype)} {tuple(token_table.shape)}")
    require(np.dtype(block_table.dtype) == np.int32 and len(block_table.shape) == 2,
            f"attention_paged: block_table must be int32 (sequences, blocks per sequence), "
            f"got {np.dtype(block_table.dtype)} {tuple(block_table.shape)}")
    return meta((t, n_heads * d), np.float32)


@op(infer=_infer_paged, input_dtypes=("f32", tuple(KV_CACHE_DTYPES), tuple(KV_CACHE_DTYPES),
                                      "i32", "i32"))
def attention_paged(qkv, k_pool, v_pool, token_table, block_table, n_heads=1, theta=10000.0,
                    style="interleaved", scale=None, freq_factors=None, attn_factor=1.0,
                    softcap=0.0, window=0, *, backend="auto"):
    """attention_cached for a batch of sequences whose caches are blocks of a shared pool
    (vLLM's paged attention): T tokens of any sequences, token t being sequence
    token_table[t, 0]'s token at position token_table[t, 1]; position p of sequence b is
    row p % block_size of pool block block_table[b, p // block_size]. Pools are
    (blocks, block_size, Hkv, D), float32 or float16 (both alike, rounded as
    attention_cached's caches). First every token's key (rotated to its position) and
    value are written to its row; then each token attends causally over its sequence's
    positions 0 .. its own (its last `window` where window > 0), rows of this batch's
    tokens included. A batch mixes prompts' chunks and decoding's single tokens; blocks
    may be shared by sequences (a cached prefix) as long as no token of the batch writes
    to a row another token reads as an earlier position of a different sequence.
    Returns (T, n_heads * D); the other parameters are attention_cached's.

    Entries of token_table and block_table outside the pools (a negative or too large
    block, a position beyond the table) are the caller's to avoid: the reference raises,
    kernels may write nothing and return NaN rows for such tokens."""
    t = qkv.shape[0]
    _, block_size, hkv, d = k_pool.shape
    tokens = np.asarray(token_table, np.int64).reshape(t, 2)
    blocks = np.asarray(block_table, np.int64)
    q, k, v = np.split(np.asarray(qkv, np.float32), [n_heads * d, (n_heads + hkv) * d], axis=1)
    turn = dict(theta=theta, style=style, freq_factors=freq_factors, attn_factor=attn_factor)

    def row(seq: int, pos: int) -> tuple[int, int]:
        require(0 <= seq < blocks.shape[0] and 0 <= pos < blocks.shape[1] * block_size,
                f"attention_paged: sequence {seq} position {pos} is outside the block table "
                f"{tuple(blocks.shape)} of blocks of {block_size}")
        block = int(blocks[seq, pos // block_size])
        require(0 <= block < k_pool.shape[0],
                f"attention_paged: block {block} is outside the pool of {k_pool.shape[0]}")
        return block, pos % block_size

    rotated_q = np.empty((t, n_heads, d), np.float32)
    for i, (seq, pos) in enumerate(tokens):
        at = row(int(seq), int(pos))
        rotated_q[i] = rope.reference(q[i].reshape(1, n_heads, d), int(pos), **turn)[0]
        k_pool[at] = rope.reference(k[i].reshape(1, hkv, d), int(pos), **turn)[0]
        v_pool[at] = v[i].reshape(hkv, d)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = np.empty((t, n_heads, d))
    for i, (seq, pos) in enumerate(tokens):
        first = max(0, int(pos) - window + 1) if window else 0
        rows = [row(int(seq), p) for p in range(first, int(pos) + 1)]
        keys = np.asarray(np.stack([k_pool[r] for r in rows]), np.float64)    # (n, Hkv, D)
        values = np.asarray(np.stack([v_pool[r] for r in rows]), np.float64)
        for h in range(n_heads):
            scores = keys[:, h * hkv // n_heads] @ np.asarray(rotated_q[i, h], np.float64)
            scores *= scale
            if softcap:
                scores = softcap * np.tanh(scores / softcap)
            p = np.exp(scores - scores.max())
            out[i, h] = (p / p.sum()) @ values[:, h * hkv // n_heads]
    return out.reshape(t, n_heads * d).astype(np.float32)
