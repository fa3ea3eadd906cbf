"""A transformer layer's kernels on the CPU: rmsnorm, SwiGLU / GeGLU, and attention over a KV
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
def glu(both, gelu, out):
    """out = act(gate) * up for both = [gate | up] (M, 2F): act silu, or GELU (its tanh
    form, written x * sigmoid(2u) as the reference does) when `gelu`."""
    m, f = out.shape
    for i in range(m):
        for j in range(f):
            g = both[i, j]
            if gelu:
                u = _F32(0.7978845608028654) * (g + _F32(0.044715) * g * g * g)
                act = g / (_F32(1) + np.exp(-2 * u))
            else:
                act = g / (_F32(1) + np.exp(-g))
            out[i, j] = act * both[i, f + j]


@_serial
def add(a, b, out):
    """out = a + b (2-D)."""
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


def norm_glu(x, gain, eps, w, gelu, out):
    """out = act(h Wg^T) * (h Wu^T), h = rmsnorm(x, gain), W = [Wg; Wu] (glu's act)."""
    normed = np.empty_like(x)
    rmsnorm(x, gain, eps, normed)
    both = quantized.matmul(normed, w)
    glu(both, gelu, out)


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


#: Keys per task of attention: a long context's keys are split among the threads (each
#: range's softmax merged after), which a task per head could not keep busy.
KEY_RANGE = 128
#: Every float16 value as float32, indexed by its bits: how the kernel reads a float16
#: cache (numba has no float16 type; such a cache comes as its uint16 bits).
F16_VALUES = np.arange(1 << 16).astype(np.uint16).view(np.float16).astype(_F32)


def attention_cached(qkv, k_cache, v_cache, state, table, n_heads, neox, scale, softcap, window,
                     max_keys, out):
    """Attention of S new tokens at positions pos.. (pos = state[1]) over the caches
    (n_ctx, Hkv, D), float32 or float16, which get the new keys (rotated) and values
    first; queries are rotated too and attend causally (to their last `window` keys when
    window > 0), scores capped to softcap * tanh(score / softcap) when softcap > 0; with
    max_keys beyond n_ctx the caches are rings (position j in row j % n_ctx). Tokens at
    positions max_keys and beyond get NaN rows, as on the GPU, where the position is read
    on the device. Float16 caches store the new rows rounded to nearest even (numpy's
    rounding, the reference's) and are read as float32; the math is the same."""
    if k_cache.dtype != np.float16:
        _attention_cached(qkv, k_cache, v_cache, None, state, table, n_heads, neox, scale,
                          softcap, window, max_keys, out)
        return
    # numba has no float16: the new rows are rotated into float32 by the kernel, stored
    # by numpy, and the attention reads the caches' bits through F16_VALUES
    s_new = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    pos = int(state[1])
    if _positions_fit(pos, s_new, n_ctx, max_keys):
        keys = np.empty((s_new, hkv, d), _F32)
        values = np.empty((s_new, hkv, d), _F32)
        _new_rows(qkv, table, pos, n_heads, neox, keys, values)
        rows = np.arange(pos, pos + s_new) % n_ctx
        k_cache[rows] = keys
        v_cache[rows] = values
    _attention_cached(qkv, k_cache.view(np.uint16), v_cache.view(np.uint16), F16_VALUES, state,
                      table, n_heads, neox, scale, softcap, window, max_keys, out)


@_serial
def _positions_fit(pos, s_new, n_ctx, max_keys):
    """Whether positions pos .. pos + s_new - 1 are below max_keys and, unless the cache
    is a ring (max_keys beyond n_ctx), in the cache."""
    ring = max_keys > n_ctx
    return pos >= 0 and pos + s_new <= max_keys and (ring or pos + s_new <= n_ctx)


@_serial
def _new_rows(qkv, table, pos, n_heads, neox, keys, values):
    """keys, values (S, Hkv, D) = the S tokens' key heads rotated to their positions and
    their value heads."""
    s_new, hkv, d = keys.shape
    for s in range(s_new):
        for h in range(hkv):
            _rotate(qkv[s, (n_heads + h) * d:(n_heads + h + 1) * d], table, pos + s, neox,
                    keys[s, h])
            values[s, h, :] = qkv[s, (n_heads + hkv + h) * d:(n_heads + hkv + h + 1) * d]


@numba.njit(inline="always")
def _cached(cache, row, head, i, f16_values):
    """Element i of a cache row's head, as float32: the cache's own, or the float16 value
    of its bits (numba compiles the branch of the caller's types only)."""
    if f16_values is None:
        return cache[row, head, i]
    return f16_values[cache[row, head, i]]


@_parallel
def _attention_cached(qkv, k_cache, v_cache, f16_values, state, table, n_heads, neox, scale,
                      softcap, window, max_keys, out):
    """attention_cached over float32 caches (f16_values None), which this appends the new
    rows to, or over float16 caches' bits holding them already (f16_values: F16_VALUES).

    A task is a token, a key/value head with all the query heads that share it (each
    cached row is read once for them) and a range of KEY_RANGE keys; each range's
    softmax (its maximum, sum and weighted values) is merged with the others after."""
    s_new = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    pos = state[1]
    if not _positions_fit(pos, s_new, n_ctx, max_keys):
        out[:] = np.nan
        return
    group = n_heads // hkv
    if f16_values is None:
        for s in range(s_new):
            for h in range(hkv):
                _rotate(qkv[s, (n_heads + h) * d:(n_heads + h + 1) * d], table, pos + s, neox,
                        k_cache[(pos + s) % n_ctx, h])
                v_cache[(pos + s) % n_ctx, h, :] = qkv[s, (n_heads + hkv + h) * d:(n_heads + hkv + h + 1) * d]
    ranges = (pos + s_new + KEY_RANGE - 1) // KEY_RANGE
    top = np.full((s_new, hkv, ranges, group), _F32(-3.0e38))  # empty ranges weigh 0
    total = np.zeros((s_new, hkv, ranges, group), _F32)
    acc = np.zeros((s_new, hkv, ranges, group, d), _F32)
    for task in numba.prange(s_new * hkv * ranges):
        s = task // (hkv * ranges)
        kv = task // ranges % hkv
        r = task % ranges
        first = r * KEY_RANGE
        if window > 0:
            first = max(first, pos + s + 1 - window)
        stop = min(r * KEY_RANGE + KEY_RANGE, pos + s + 1)
        if first >= stop:
            continue
        q = np.empty((group, d), _F32)
        for g in range(group):
            head = kv * group + g
            _rotate(qkv[s, head * d:(head + 1) * d], table, pos + s, neox, q[g])
        scores = np.empty((group, stop - first), _F32)
        for j in range(first, stop):
            for g in range(group):
                dot = _F32(0)
                for i in range(d):
                    dot += q[g, i] * _cached(k_cache, j % n_ctx, kv, i, f16_values)
                dot *= scale
                if softcap > 0:
                    dot = softcap * np.tanh(dot / softcap)
                scores[g, j - first] = dot
        for g in range(group):
            m = scores[g, 0]
            for j in range(1, stop - first):
                m = max(m, scores[g, j])
            sum_p = _F32(0)
            for j in range(stop - first):
                scores[g, j] = np.exp(scores[g, j] - m)
                sum_p += scores[g, j]
            top[s, kv, r, g] = m
            total[s, kv, r, g] = sum_p
        for j in range(first, stop):
            for g in range(group):
                p = scores[g, j - first]
                for i in range(d):
                    acc[s, kv, r, g, i] += p * _cached(v_cache, j % n_ctx, kv, i, f16_values)
    for task in numba.prange(s_new * hkv):
        s = task // hkv
        kv = task % hkv
        seen = (pos + s + KEY_RANGE) // KEY_RANGE  # the ranges holding this token's keys
        weight = np.empty(seen, _F32)
        for g in range(group):
            m = top[s, kv, 0, g]
            for r in range(1, seen):
                m = max(m, top[s, kv, r, g])
            norm = _F32(0)
            for r in range(seen):
                weight[r] = np.exp(top[s, kv, r, g] - m)
                norm += total[s, kv, r, g] * weight[r]
            head = kv * group + g
            for i in range(d):
                value = _F32(0)
                for r in range(seen):
                    value += acc[s, kv, r, g, i] * weight[r]
                out[s, head * d + i] = value / norm
