"""Multi-head attention with grouped-query heads and a causal mask offset for KV caches:
query i of Sq sees keys j <= i + Skv - Sq. `attention_f16`: the same of float16 q, k,
v with float32 results. (The transformer's attention over a KV cache, with RoPE and the
cache's append, is transformer.attention_cached.)"""

from __future__ import annotations

import math

import numpy as np

from .registry import meta, op, require

#: The largest head the attention ops take (every backend's kernels hold a head's values
#: per thread group up to it)
MAX_HEAD_DIM = 256


def infer(q, k, v, causal=True, scale=None):
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


@op(infer=infer)
def attention(q, k, v, causal=True, scale=None, *, backend="auto"):
    """softmax(q k^T * scale + mask) v per head; q (Sq, Hq, D), k/v (Skv, Hkv, D); scale
    defaults to 1/sqrt(D)."""
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


@op(infer=infer, dtypes=("f16",))
def attention_f16(q, k, v, causal=True, scale=None, *, backend="auto"):
    """attention() of float16 q, k, v (the same shapes and mask), float32 results; the
    reference computes in float64 from the float16 values."""
    return attention.reference(q, k, v, causal, scale)
