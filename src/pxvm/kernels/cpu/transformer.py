"""A transformer layer's kernels on the CPU: rmsnorm, SwiGLU, and attention over a KV
cache with the rotary embedding (the CPU forms of pxvm.ops.transformer's fused ops,
whose numpy references they are tested against). Products are quantized.py's."""

from __future__ import annotations

import math

import numba
import numpy as np

from . import quantized

_F32 = np.float32
_serial = numba.njit(fastmath=True, cache=True, nogil=True)
_parallel = numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)


@_serial
def rmsnorm(x, gain, eps, out):
    """out = x / sqrt(mean(x^2) + eps) * gain, row by row."""
    m, k = x.shape
    for i in range(m):
        total = 0.0
        for j in range(k):
            total += np.float64(x[i, j]) * x[i, j]
        inv = _F32(1.0 / math.sqrt(total / k + eps))
        for j in range(k):
            out[i, j] = x[i, j] * inv * gain[j]


@_serial
def swiglu(both, out):
    """out = silu(gate) * up for both = [gate | up] (M, 2F)."""
    m, f = out.shape
    for i in range(m):
        for j in range(f):
            g = both[i, j]
            out[i, j] = g / (_F32(1) + np.exp(-g)) * both[i, f + j]


@_serial
def add(a, b, out):
    m, n = out.shape
    for i in range(m):
        for j in range(n):
            out[i, j] = a[i, j] + b[i, j]


def norm_matmul(x, gain, eps, w, out):
    """out = rmsnorm(x, gain) @ W^T for a quantized.pack'ed W."""
    normed = np.empty_like(x)
    rmsnorm(x, gain, eps, normed)
    quantized.matmul(normed, w, out)


def matmul_add(x, w, residual, out):
    """out = residual + x @ W^T."""
    quantized.matmul(x, w, out)
    add(out, residual, out)


def norm_swiglu(x, gain, eps, w, out):
    """out = silu(h Wg^T) * (h Wu^T), h = rmsnorm(x, gain), W = [Wg; Wu]."""
    normed = np.empty_like(x)
    rmsnorm(x, gain, eps, normed)
    both = quantized.matmul(normed, w)
    swiglu(both, out)


@_serial
def _rotate(x, table, pos, neox, out):
    """out = x (D) rotated by the angles of position `pos` (table (P, D/2, [cos, sin]))."""
    half = x.shape[0] // 2
    for i in range(half):
        c = table[pos, i, 0]
        s = table[pos, i, 1]
        if neox:
            a, b = x[i], x[i + half]
            out[i] = a * c - b * s
            out[i + half] = a * s + b * c
        else:
            a, b = x[2 * i], x[2 * i + 1]
            out[2 * i] = a * c - b * s
            out[2 * i + 1] = a * s + b * c


@_parallel
def attention_cached(qkv, k_cache, v_cache, state, table, n_heads, neox, scale, max_keys, out):
    """Attention of S new tokens at positions pos.. (pos = state[1]) over the caches
    (n_ctx, Hkv, D), which get the new keys (rotated) and values first; queries are
    rotated too and attend causally. Tokens at positions max_keys and beyond get NaN
    rows, as on the GPU, where the position is read on the device."""
    s_new = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    pos = state[1]
    if pos < 0 or pos + s_new > min(n_ctx, max_keys):
        out[:] = np.nan
        return
    group = n_heads // hkv
    for s in range(s_new):
        for h in range(hkv):
            _rotate(qkv[s, (n_heads + h) * d:(n_heads + h + 1) * d], table, pos + s, neox,
                    k_cache[pos + s, h])
            v_cache[pos + s, h, :] = qkv[s, (n_heads + hkv + h) * d:(n_heads + hkv + h + 1) * d]
    for task in numba.prange(s_new * n_heads):
        s = task // n_heads
        h = task % n_heads
        kv = h // group
        q = np.empty(d, _F32)
        _rotate(qkv[s, h * d:(h + 1) * d], table, pos + s, neox, q)
        keys = pos + s + 1
        scores = np.empty(keys, _F32)
        top = -np.inf
        for j in range(keys):
            dot = _F32(0)
            for i in range(d):
                dot += q[i] * k_cache[j, kv, i]
            scores[j] = dot * scale
            top = max(top, scores[j])
        total = _F32(0)
        for j in range(keys):
            scores[j] = np.exp(scores[j] - top)
            total += scores[j]
        acc = np.zeros(d, _F32)
        for j in range(keys):
            p = scores[j]
            for i in range(d):
                acc[i] += p * v_cache[j, kv, i]
        for i in range(d):
            out[s, h * d + i] = acc[i] / total
