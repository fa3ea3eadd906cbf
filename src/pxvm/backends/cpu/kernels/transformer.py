"""A transformer layer's kernels on the CPU: rmsnorm, SwiGLU / GeGLU, and attention over a KV
cache (or a paged one's blocks, through a block table) with the rotary embedding (the CPU
forms of pxvm.ops.transformer's fused ops, whose numpy references they are tested
against). Products are quantized.py's."""

from __future__ import annotations

import math

import numba
import numpy as np
from llvmlite import ir
from numba import types
from numba.extending import intrinsic, overload

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
#: Keys (summed over new tokens and key/value heads) up to which attention_cached runs on
#: the calling thread: a parallel pass's start costs more than that work.
SERIAL_KEYS = 512


def attention_cached(qkv, k_cache, v_cache, state, table, n_heads, neox, scale, softcap, window,
                     max_keys, out):
    """Attention of S new tokens at positions pos.. (pos = state[1]) over the caches
    (n_ctx, Hkv, D), float32 or float16, which get the new keys (rotated) and values
    first; queries are rotated too and attend causally (to their last `window` keys when
    window > 0), scores capped to softcap * tanh(score / softcap) when softcap > 0; with
    max_keys beyond n_ctx the caches are rings (position j in row j % n_ctx). Tokens at
    positions max_keys and beyond get NaN rows, as on the GPU, where the position is read
    on the device. Float16 caches store the new rows rounded to nearest even and are read
    as float32 (_half_to_float, a row at a time); the math is the same."""
    if k_cache.dtype == np.float16:  # numba has no float16 type: the caches' bits
        k_cache, v_cache = k_cache.view(np.uint16), v_cache.view(np.uint16)
    s_new = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    pos = int(state[1])
    ring = max_keys > n_ctx  # position j in row j % n_ctx (a sliding window's cache)
    if pos < 0 or pos + s_new > max_keys or (not ring and pos + s_new > n_ctx):
        out[:] = np.nan
        return
    _append_cached(qkv, k_cache, v_cache, pos, table, n_heads, neox)
    ranges = (pos + s_new + KEY_RANGE - 1) // KEY_RANGE
    group = n_heads // hkv
    top = np.full((s_new, hkv, ranges, group), -3.0e38, np.float32)  # empty ranges weigh 0
    total = np.zeros((s_new, hkv, ranges, group), np.float32)
    acc = np.zeros((s_new, hkv, ranges, group, d), np.float32)
    keys = (pos + s_new) * s_new * hkv
    run = _cached_tasks_serial if keys <= SERIAL_KEYS else _cached_tasks_parallel
    run(qkv, k_cache, v_cache, pos, table, n_heads, neox, scale, softcap, window, top, total,
        acc, out)


@intrinsic
def _half_to_float(typingctx, bits):
    """The float16 value whose bits are `bits` (uint16), as float32: LLVM's conversion,
    the CPU's instruction (F16C's vcvtph2ps, as vectors.py's scale loads), so a row of
    them converts as fast as float32 loads."""
    def codegen(context, builder, signature, args):
        return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
    return types.float32(types.uint16), codegen


@intrinsic
def _float_to_half(typingctx, x):
    """The bits (uint16) of float32 x rounded to float16, to nearest even (as numpy)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(builder.fptrunc(args[0], ir.HalfType()), ir.IntType(16))
    return types.uint16(types.float32), codegen


def _cache_row(cache, row, head, buffer):
    """Head `head` of a cache row as float32 (D): a float32 cache's own values, or a
    float16 cache's (its bits) converted into `buffer`, once for every query head that
    reads them."""
    raise NotImplementedError("compiled only (its overload below)")


@overload(_cache_row)
def _cache_row_by_type(cache, row, head, buffer):
    if cache.dtype == types.uint16:
        def converted(cache, row, head, buffer):
            for i in range(buffer.shape[0]):
                buffer[i] = _half_to_float(cache[row, head, i])
            return buffer
        return converted
    return lambda cache, row, head, buffer: cache[row, head]


def _written(x, cache):
    """Float32 x as an element of `cache` holds it: itself, or its float16 bits."""
    raise NotImplementedError("compiled only (its overload below)")


@overload(_written)
def _written_by_type(x, cache):
    if cache.dtype == types.uint16:
        return lambda x, cache: _float_to_half(x)
    return lambda x, cache: x


@_serial
def _append_cached(qkv, k_cache, v_cache, pos, table, n_heads, neox):
    """The S new tokens' keys (rotated) and values into cache rows (pos + s) % n_ctx."""
    s_new = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    rotated = np.empty(d, _F32)
    for s in range(s_new):
        for h in range(hkv):
            row = (pos + s) % n_ctx
            _rotate(qkv[s, (n_heads + h) * d:(n_heads + h + 1) * d], table, pos + s, neox,
                    rotated)
            for i in range(d):
                k_cache[row, h, i] = _written(rotated[i], k_cache)
                v_cache[row, h, i] = _written(qkv[s, (n_heads + hkv + h) * d + i], v_cache)


@_serial
def _cached_range(task, qkv, k_cache, v_cache, pos, table, n_heads, neox, scale, softcap,
                  window, top, total, acc, out):
    """Task `task` of attention_cached: a token, a key/value head with all the query heads
    that share it (each cached row is read once for them) and a range of KEY_RANGE keys,
    whose softmax (its maximum, sum and weighted values) goes to top, total and acc; with
    one range, the normalised output straight to out."""
    n_ctx, hkv, d = k_cache.shape
    ranges, group = top.shape[2], top.shape[3]
    s = task // (hkv * ranges)
    kv = task // ranges % hkv
    r = task % ranges
    first = r * KEY_RANGE
    if window > 0:
        first = max(first, pos + s + 1 - window)
    stop = min(r * KEY_RANGE + KEY_RANGE, pos + s + 1)
    if first >= stop:
        return
    q = np.empty((group, d), _F32)
    for g in range(group):
        head = kv * group + g
        _rotate(qkv[s, head * d:(head + 1) * d], table, pos + s, neox, q[g])
    rows = np.arange(first, stop) % n_ctx
    _range_softmax(k_cache, v_cache, rows, kv, q, scale, softcap, top[s, kv, r],
                   total[s, kv, r], acc[s, kv, r])
    if ranges == 1:  # nothing to merge: normalised here
        for g in range(group):
            head = kv * group + g
            for i in range(d):
                out[s, head * d + i] = acc[s, kv, 0, g, i] / total[s, kv, 0, g]


@_serial
def _cached_merge(task, pos, top, total, acc, out):
    """The ranges of token task // Hkv's key/value head task % Hkv merged into out."""
    hkv, group, d = top.shape[1], top.shape[3], acc.shape[4]
    s = task // hkv
    kv = task % hkv
    seen = (pos + s + KEY_RANGE) // KEY_RANGE  # the ranges holding this token's keys
    for g in range(group):
        head = kv * group + g
        _merge_ranges(top[s, kv, :seen, g], total[s, kv, :seen, g], acc[s, kv, :seen, g],
                      out[s, head * d:(head + 1) * d])


@_parallel
def _cached_tasks_parallel(qkv, k_cache, v_cache, pos, table, n_heads, neox, scale, softcap,
                           window, top, total, acc, out):
    """Every task of attention_cached, then their merge, on the thread pool."""
    for task in numba.prange(top.shape[0] * top.shape[1] * top.shape[2]):
        _cached_range(task, qkv, k_cache, v_cache, pos, table, n_heads, neox, scale, softcap,
                      window, top, total, acc, out)
    if top.shape[2] > 1:
        for task in numba.prange(top.shape[0] * top.shape[1]):
            _cached_merge(task, pos, top, total, acc, out)


@_serial
def _cached_tasks_serial(qkv, k_cache, v_cache, pos, table, n_heads, neox, scale, softcap,
                         window, top, total, acc, out):
    """The same on the calling thread: cheaper than the pool's start for little work."""
    for task in range(top.shape[0] * top.shape[1] * top.shape[2]):
        _cached_range(task, qkv, k_cache, v_cache, pos, table, n_heads, neox, scale, softcap,
                      window, top, total, acc, out)
    if top.shape[2] > 1:
        for task in range(top.shape[0] * top.shape[1]):
            _cached_merge(task, pos, top, total, acc, out)


#: Tasks of attention_paged's key ranges that keep the threads busy: a batch of fewer
#: (token, key/value head) pairs splits each token's keys into ranges (KEY_RANGE long at
#: least) up to about this many tasks; a batch of many decoding sequences takes a range
#: a token.
PAGED_TASKS = 256


def attention_paged(qkv, k_pool, v_pool, tokens, blocks, table, n_heads, neox, scale,
                    softcap, window, out):
    """attention_paged: T tokens, token t sequence tokens[t, 0]'s at position tokens[t, 1],
    over pools (blocks, block_size, Hkv, D), float32 or float16, position p of sequence b
    in row p % block_size of block blocks[b, p // block_size]. Every token's key (rotated)
    and value are written to its row first; then each token attends causally over its
    sequence's positions (its last `window` where window > 0), as attention_cached does.
    A token whose table entries fall outside the tables or the pools gets a NaN row (and
    writes nothing where its own row is outside them)."""
    if k_pool.dtype == np.float16:  # numba has no float16 type: the pools' bits
        k_pool, v_pool = k_pool.view(np.uint16), v_pool.view(np.uint16)
    n_blocks, block_size, hkv, d = k_pool.shape
    # one row a (block, slot): what _cache_row reads
    k_rows = k_pool.reshape(n_blocks * block_size, hkv, d)
    v_rows = v_pool.reshape(n_blocks * block_size, hkv, d)
    _attention_paged(qkv, k_rows, v_rows, block_size, tokens, blocks, table, n_heads, neox,
                     scale, softcap, window, out)


@_serial
def _first_key(pos, window):
    """The first position a token at `pos` sees."""
    return max(0, pos + 1 - window) if window > 0 else 0


@_serial
def _paged_row(blocks, block_size, n_rows, seq, pos):
    """The pool row of sequence seq's position pos, or -1 outside the tables or the pool."""
    if seq < 0 or seq >= blocks.shape[0] or pos < 0 or pos >= blocks.shape[1] * block_size:
        return -1
    row = blocks[seq, pos // block_size] * block_size + pos % block_size
    return row if 0 <= row < n_rows else -1


@_serial
def _paged_token_ok(blocks, block_size, n_rows, seq, pos, window):
    """Whether every position token (seq, pos) reads and writes has a pool row."""
    for p in range(_first_key(pos, window), pos + 1, block_size):
        if _paged_row(blocks, block_size, n_rows, seq, p) < 0:
            return False
    return _paged_row(blocks, block_size, n_rows, seq, pos) >= 0


@_parallel
def _attention_paged(qkv, k_rows, v_rows, block_size, tokens, blocks, table, n_heads, neox,
                     scale, softcap, window, out):
    """attention_paged over pools as rows (blocks * block_size, Hkv, D), float32 or
    float16 bits (uint16).

    A task is a token, a key/value head with the query heads that share it (each row is
    read once for them) and a range of its keys; the ranges' softmaxes are merged after,
    as attention_cached's."""
    t_new = qkv.shape[0]
    n_rows, hkv, d = k_rows.shape
    group = n_heads // hkv
    ok = np.empty(t_new, np.bool_)
    longest = 1
    for t in range(t_new):
        ok[t] = _paged_token_ok(blocks, block_size, n_rows, tokens[t, 0], tokens[t, 1], window)
        if ok[t]:
            longest = max(longest, tokens[t, 1] + 1 - _first_key(tokens[t, 1], window))
    rotated = np.empty(d, _F32)
    for t in range(t_new):
        pos = tokens[t, 1]
        row = _paged_row(blocks, block_size, n_rows, tokens[t, 0], pos)
        if row < 0:
            continue
        for h in range(hkv):
            _rotate(qkv[t, (n_heads + h) * d:(n_heads + h + 1) * d], table, pos, neox, rotated)
            for i in range(d):
                k_rows[row, h, i] = _written(rotated[i], k_rows)
                v_rows[row, h, i] = _written(qkv[t, (n_heads + hkv + h) * d + i], v_rows)
    # ranges a token: enough for PAGED_TASKS tasks, each at least KEY_RANGE keys long
    ranges = min((longest + KEY_RANGE - 1) // KEY_RANGE,
                 max(1, (PAGED_TASKS + t_new * hkv - 1) // (t_new * hkv)))
    range_len = (longest + ranges - 1) // ranges
    top = np.full((t_new, hkv, ranges, group), _F32(-3.0e38))  # empty ranges weigh 0
    total = np.zeros((t_new, hkv, ranges, group), _F32)
    acc = np.zeros((t_new, hkv, ranges, group, d), _F32)
    for task in numba.prange(t_new * hkv * ranges):
        t = task // (hkv * ranges)
        kv = task // ranges % hkv
        r = task % ranges
        if not ok[t]:
            continue
        seq, pos = tokens[t, 0], tokens[t, 1]
        first = _first_key(pos, window) + r * range_len
        stop = min(first + range_len, pos + 1)
        if first >= stop:
            continue
        q = np.empty((group, d), _F32)
        for g in range(group):
            head = kv * group + g
            _rotate(qkv[t, head * d:(head + 1) * d], table, pos, neox, q[g])
        rows = np.empty(stop - first, np.int64)
        for j in range(first, stop):
            rows[j - first] = _paged_row(blocks, block_size, n_rows, seq, j)
        _range_softmax(k_rows, v_rows, rows, kv, q, scale, softcap, top[t, kv, r],
                       total[t, kv, r], acc[t, kv, r])
    for task in numba.prange(t_new * hkv):
        t = task // hkv
        kv = task % hkv
        for g in range(group):
            head = kv * group + g
            if ok[t]:
                _merge_ranges(top[t, kv, :, g], total[t, kv, :, g], acc[t, kv, :, g],
                              out[t, head * d:(head + 1) * d])
            else:
                out[t, head * d:(head + 1) * d] = np.nan


@_serial
def _range_softmax(k_rows, v_rows, rows, kv, q, scale, softcap, top, total, acc):
    """One range's softmax for the query heads q (group, D) of key/value head kv over the
    cache rows `rows`: each head's max score into top (group), its sum of exponentials
    relative to that into total (group) and its exponential-weighted values into acc
    (group, D)."""
    group, d = q.shape
    n = rows.shape[0]
    scores = np.empty((group, n), _F32)
    buffer = np.empty(d, _F32)
    for j in range(n):
        key = _cache_row(k_rows, rows[j], kv, buffer)
        for g in range(group):
            dot = _F32(0)
            for i in range(d):
                dot += q[g, i] * key[i]
            dot *= scale
            if softcap > 0:
                dot = softcap * np.tanh(dot / softcap)
            scores[g, j] = dot
    for g in range(group):
        m = scores[g, 0]
        for j in range(1, n):
            m = max(m, scores[g, j])
        sum_p = _F32(0)
        for j in range(n):
            scores[g, j] = np.exp(scores[g, j] - m)
            sum_p += scores[g, j]
        top[g] = m
        total[g] = sum_p
    for j in range(n):
        value = _cache_row(v_rows, rows[j], kv, buffer)
        for g in range(group):
            p = scores[g, j]
            for i in range(d):
                acc[g, i] += p * value[i]


@_serial
def _merge_ranges(top, total, acc, out):
    """out (D) = the ranges' softmaxes (max top[r], sum total[r], weighted values acc[r])
    merged: rescaled to their common max and normalised."""
    m = top[0]
    for r in range(1, top.shape[0]):
        m = max(m, top[r])
    weight = np.empty(top.shape[0], _F32)
    norm = _F32(0)
    for r in range(top.shape[0]):
        weight[r] = np.exp(top[r] - m)
        norm += total[r] * weight[r]
    for i in range(out.shape[0]):
        value = _F32(0)
        for r in range(top.shape[0]):
            value += acc[r, i] * weight[r]
        out[i] = value / norm
