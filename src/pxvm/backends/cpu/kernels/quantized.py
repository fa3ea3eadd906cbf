"""Products with GGUF-quantized weights on the CPU, computed on the quantized values.

A weight is repacked once, when first used, into one of two forms that SIMD code reads
well, both keeping its integer values:

- `Nibbles` (Q4_0, Q4_1, Q4_K): 4-bit values q in 0..15 with a scale and an offset per
  32 values of a row (value = scale * q + offset);
- `Bytes` (Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q5_K, Q6_K): 8-bit signed values with a scale
  per block of a row (32 values, 16 for Q2_K, Q3_K and Q6_K; value = scale * q), and an
  offset for Q5_1, Q2_K and Q5_K (value = scale * q + offset).

Rows are grouped in tiles of TILE_ROWS, a row a 32-bit SIMD lane: the lanes of a tile
hold the same few values of every row next to each other ([tile, block, group, row]), so
that the inner loop runs along rows with the activation broadcast and never needs a sum
across lanes. A lane holds a pair of neighbouring values in each 16-bit half (or can be
shifted and masked into such pairs), the form of x86's multiply-adds of int16 pairs.

Decoding (one row of activations) multiplies integers, the activations quantized to
int16 (see the kernels' comment), on numba's threads. It is memory-bound: each weight
byte is read once, and there are more of them than the caches hold. So a tile's values
and scales for a block are one record in memory, a single stream (arrays q, scale and
offset are views into it), and scales are stored as float16 wherever that is exact (the
GGUF types store them so, but for Q4_K's and Q6_K's products of two scales): 20 bytes
per 32 Q4 values, instead of 24 with float32 scales in arrays of their own.

Prompts split the rows among as many Python threads, each dequantizing its tiles to
float32 (as W^T, rows along the SIMD lanes) and multiplying them by single-threaded BLAS
(the CPU backend holds BLAS to one thread while it runs: two thread pools on the same
cores slow each other down many times over).

Every function takes plain numpy arrays; pxvm.backends.cpu.ops registers them as kernels
of the "cpu" backend, and tests compare them with the ops' numpy references.

One module for every type: the two packed forms, their repacking and the products over
them belong together (a product's inner loop is written against its form's layout).
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

from .vectors import (
    dot_pairs,
    high_byte_pairs,
    load_floats,
    load_ints,
    low_byte_pairs,
    multiply_add,
    nibble_pairs,
    nibbles,
    signed_bytes,
    splat,
    store_floats,
    zeros,
)

#: Rows per tile: 64 int32 or float32 lanes are four AVX-512 or eight AVX2 registers of
#: sums (the kernels spell out its 4 vectors of 16 rows).
TILE_ROWS = 64
#: Each prompt thread dequantizes at most this many weight values at a time (a float32
#: scratch of 4 MiB) before each BLAS product, so a large LM head needs no copy of its own.
DEQUANTIZE_VALUES = 1 << 20

_F32 = np.float32
#: The dtype of scales that are float16 values: their bits (numba has no float16 arrays).
HALF = np.uint16


@dataclass(frozen=True)
class Nibbles:
    """4-bit values: q (tiles, K / 32, 4, TILE_ROWS) uint32, lane [t, b, g, r] holding
    values 8g..8g+7 of block b of row r as two 16-bit halves, value 8g + 2i + h in bits
    4i..4i+3 of half h (so that shifts and masks of the halves give pairs of neighbours);
    scale and offset (tiles, K / 32, TILE_ROWS), float32 or float16 bits (HALF). All
    three are views into one buffer, a record per tile and block."""

    q: np.ndarray
    scale: np.ndarray
    offset: np.ndarray
    n: int
    k: int


@dataclass(frozen=True)
class Bytes:
    """8-bit values: q (tiles, K / block, block / 4, TILE_ROWS) uint32, lane [t, b, g, r]
    holding values 4g..4g+3 of block b of row r as int8 in the byte order 0, 2, 1, 3 (so
    that the low and the high bytes of its 16-bit halves are pairs of neighbours); scale
    and, for types with one, offset (tiles, K / block, TILE_ROWS), float32 or float16 bits
    (HALF). All are views into one buffer, a record per tile and block."""

    q: np.ndarray
    scale: np.ndarray
    offset: np.ndarray | None
    n: int
    k: int


@dataclass(frozen=True)
class Dense:
    """float32 (N, K): F32, F16 and BF16 weights, multiplied by BLAS."""

    w: np.ndarray
    n: int
    k: int


# ---- repacking: GGUF blocks -> values and scales -> tiles ----------------------------
def _f16(raw: np.ndarray, start: int) -> np.ndarray:
    """The float16 at byte `start` of every block, as float32 (blocks on the last axis)."""
    return np.ascontiguousarray(raw[..., start:start + 2]).view(np.float16)[..., 0].astype(_F32)


def _nibbles_of(qs: np.ndarray) -> np.ndarray:
    """GGML's 32-value nibble blocks (16 bytes: value j low, j + 16 high) as values."""
    return np.concatenate([qs & 15, qs >> 4], axis=-1)


def _split_q4_0(raw, n, k):
    b = raw.reshape(n, k // 32, 18)
    d = _f16(b, 0)
    return _nibbles_of(b[..., 2:]), d, -8 * d


def _split_q4_1(raw, n, k):
    b = raw.reshape(n, k // 32, 20)
    return _nibbles_of(b[..., 4:]), _f16(b, 0), _f16(b, 2)


def _k_scales(b):
    """The (scale, offset) of each 32-value block of Q4_K / Q5_K super-blocks `b` (f16 d
    and dmin, then 12 bytes of 6-bit scales and mins): d * sc and -dmin * m."""
    d, dmin = _f16(b, 0), _f16(b, 2)
    s = b[..., 4:16].astype(np.uint8)
    lo, hi, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (mix & 15) | ((lo >> 6) << 4)], axis=-1).astype(_F32)
    mn = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 6) << 4)], axis=-1).astype(_F32)
    n = b.shape[0]
    return (d[..., None] * sc).reshape(n, -1), (-dmin[..., None] * mn).reshape(n, -1)


def _k_nibbles(qs, n, k):
    """Q4_K / Q5_K's 128 bytes of nibbles a super-block as 8 blocks of 32 values: each 32
    bytes hold 64 values, 32 in the low nibbles, then 32 in the high."""
    qs = qs.reshape(n, k // 256, 4, 1, 32)
    return np.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, k // 32, 32)


def _split_q4_k(raw, n, k):
    """Q4_K super-blocks (256 values: f16 d and dmin, 12 bytes of 6-bit scales and mins,
    128 bytes of nibbles) as 8 blocks of 32 values with scale d*sc and offset -dmin*m."""
    b = raw.reshape(n, k // 256, 144)
    return (_k_nibbles(b[..., 16:], n, k), *_k_scales(b))


def _split_q5_k(raw, n, k):
    """Q5_K super-blocks (Q4_K's, with 32 bytes of fifth bits before the nibbles: bit i
    of byte l belongs to value 32 i + l) as Q4_K's blocks of values 0..31."""
    b = raw.reshape(n, k // 256, 176)
    fifth = np.unpackbits(b[..., 16:48].reshape(n, k // 256, 32, 1), axis=-1,
                          bitorder="little")                      # (.., byte l, bit i)
    fifth = np.swapaxes(fifth, -1, -2).reshape(n, k // 32, 32)     # value 32 i + l
    q = _k_nibbles(b[..., 48:], n, k) | (fifth << 4)
    return (q.astype(np.int8), *_k_scales(b))


def _split_q8_0(raw, n, k):
    b = raw.reshape(n, k // 32, 34)
    return np.ascontiguousarray(b[..., 2:]).view(np.int8), _f16(b, 0)


def _split_q5_0(raw, n, k):
    """Q5_0 blocks (f16 d, 32 fifth bits, 16 bytes of nibbles) as values q - 16, scale d."""
    b = raw.reshape(n, k // 32, 22)
    fifth = np.unpackbits(b[..., 2:6], axis=-1, bitorder="little")   # bit j: value j
    q = (_nibbles_of(b[..., 6:]) | (fifth << 4)).astype(np.int16) - 16
    return q.astype(np.int8), _f16(b, 0)


def _split_q5_1(raw, n, k):
    """Q5_1 blocks (f16 d, f16 m, 32 fifth bits, 16 bytes of nibbles) as values q, scale
    d and offset m."""
    b = raw.reshape(n, k // 32, 24)
    fifth = np.unpackbits(b[..., 4:8], axis=-1, bitorder="little")
    return (_nibbles_of(b[..., 8:]) | (fifth << 4)).astype(np.int8), _f16(b, 0), _f16(b, 2)


def _k_crumbs(qs, n, k):
    """Q2_K / Q3_K's 64 bytes of 2-bit values a super-block, in order: value v is bits
    2 ((v >> 5) & 3).. of byte 32 (v >> 7) + (v & 31)."""
    qs = qs.reshape(n, k // 256, 2, 1, 32)
    return np.concatenate([(qs >> s) & 3 for s in (0, 2, 4, 6)], axis=3).reshape(n, k // 16, 16)


def _split_q2_k(raw, n, k):
    """Q2_K super-blocks (16 bytes of 4-bit scale and min pairs, 64 bytes of 2-bit values,
    f16 d and dmin) as 16 blocks of 16 values q with scale d*sc and offset -dmin*m."""
    b = raw.reshape(n, k // 256, 84)
    d, dmin = _f16(b, 80)[..., None], _f16(b, 82)[..., None]
    scale = (d * (b[..., 0:16] & 15)).reshape(n, k // 16)
    offset = (-dmin * (b[..., 0:16] >> 4)).reshape(n, k // 16)
    return _k_crumbs(b[..., 16:80], n, k).astype(np.int8), scale, offset


def _split_q3_k(raw, n, k):
    """Q3_K super-blocks (32 bytes of high bits, 64 bytes of 2-bit values, 12 bytes of
    6-bit scales, f16 d) as 16 blocks of 16 values q - 4 (the high bit clear: - 4) with
    scale d * (scale - 32)."""
    b = raw.reshape(n, k // 256, 110)
    high = np.unpackbits(b[..., 0:32].reshape(n, k // 256, 32, 1), axis=-1,
                         bitorder="little")
    high = np.swapaxes(high, -1, -2).reshape(n, k // 16, 16)      # bit i of byte l: 32 i + l
    q = _k_crumbs(b[..., 32:96], n, k).astype(np.int16) - 4 * (1 - high.astype(np.int16))
    packed = b[..., 96:108]
    i = np.arange(16)
    low4 = (packed[..., i & 7] >> (4 * (i >> 3))) & 15
    high2 = (packed[..., 8 + (i & 3)] >> (2 * (i >> 2))) & 3
    sc = (low4 | (high2 << 4)).astype(_F32) - 32
    return q.astype(np.int8), (_f16(b, 108)[..., None] * sc).reshape(n, k // 16)


def _split_q6_k(raw, n, k):
    """Q6_K super-blocks (256 values: 128 bytes of low nibbles, 64 of high 2-bit pairs,
    16 int8 scales, f16 d) as 16 blocks of 16 values q - 32 with scale d*scale."""
    b = raw.reshape(n, k // 256, 210)
    ql = b[..., 0:128].reshape(n, -1, 2, 64)       # two halves of 128 values
    qh = b[..., 128:192].reshape(n, -1, 2, 32)
    scales = np.ascontiguousarray(b[..., 192:208]).view(np.int8).astype(_F32)
    d = _f16(b, 208)
    low = np.concatenate([ql & 15, ql >> 4], axis=-1)                  # (.., 2, 128)
    high = np.concatenate([(qh >> s) & 3 for s in (0, 2, 4, 6)], axis=-1)
    q = (low | (high << 4)).astype(np.int16) - 32
    return q.astype(np.int8).reshape(n, k // 16, 16), (d[..., None] * scales).reshape(n, k // 16)


_NIBBLE_TYPES = {T.Q4_0: _split_q4_0, T.Q4_1: _split_q4_1, T.Q4_K: _split_q4_k}
_BYTE_TYPES = {T.Q5_0: _split_q5_0, T.Q5_1: _split_q5_1, T.Q8_0: _split_q8_0,
               T.Q2_K: _split_q2_k, T.Q3_K: _split_q3_k, T.Q5_K: _split_q5_k,
               T.Q6_K: _split_q6_k}
#: The GGML types this module multiplies by.
TYPES = (T.F32, T.F16, T.BF16, *_NIBBLE_TYPES, *_BYTE_TYPES)


def _tiled(a: np.ndarray, n: int) -> np.ndarray:
    """(N, blocks, ...) -> (tiles, blocks, ..., TILE_ROWS), rows zero-padded to a tile."""
    tiles = -(-n // TILE_ROWS)
    padded = np.zeros((tiles * TILE_ROWS, *a.shape[1:]), a.dtype)
    padded[:n] = a
    padded = padded.reshape(tiles, TILE_ROWS, *a.shape[1:])
    return np.moveaxis(padded, 1, -1)


def _scales(*scales: np.ndarray) -> list[np.ndarray]:
    """The scales as float16 bits (HALF) when every one of them is a float16, else
    float32."""
    scales = [s.astype(_F32) for s in scales]
    with np.errstate(over="ignore"):  # too large for float16: inf, then not equal
        halves = [s.astype(np.float16) for s in scales]
    if all(np.array_equal(h.astype(_F32), s) for h, s in zip(halves, scales)):
        return [h.view(HALF) for h in halves]
    return scales


def _records(*parts: np.ndarray) -> list[np.ndarray]:
    """Tiled arrays (tiles, blocks, ...) copied into one buffer, a record per tile and
    block holding each array's part in turn; their views into it, in order."""
    tiles, blocks = parts[0].shape[:2]
    sizes = [a[0, 0].nbytes for a in parts]
    record = sum(sizes)
    assert record % 64 == 0  # every record, and so every vector, starts a cache line
    raw = np.empty(tiles * blocks * record + 64, np.uint8)
    start = -raw.ctypes.data % 64
    views, at = [], start
    for a, size in zip(parts, sizes):
        view = np.ndarray(a.shape, a.dtype, raw, at,
                          (blocks * record, record, *np.empty(a.shape[2:], a.dtype).strides))
        view[...] = a
        views.append(view)
        at += size
    return views


def pack(raw: np.ndarray, qtype: str, k: int) -> Nibbles | Bytes | Dense:
    """The raw GGUF rows (N, row bytes) of a weight of type `qtype`, `k` values a row,
    repacked for the products here."""
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.shape[0]
    qtype = T[qtype]
    if qtype in (T.F32, T.F16):
        values = raw.view(np.float32 if qtype == T.F32 else np.float16).reshape(n, k)
        return Dense(np.ascontiguousarray(values, _F32), n, k)
    if qtype == T.BF16:  # the high half of a float32
        bits = raw.view(np.uint16).reshape(n, k).astype(np.uint32) << 16
        return Dense(bits.view(_F32), n, k)
    if qtype in _NIBBLE_TYPES:
        q, scale, offset = _NIBBLE_TYPES[qtype](raw, n, k)
        # value 8g + 2i + h of a block -> bits 4i.. of half h of lane g: the lane's bytes
        # hold values (0, 2), (4, 6), (1, 3), (5, 7) of the group, low nibble first
        q = q.astype(np.uint8).reshape(n, k // 32, 4, 8)
        lanes = q[..., [0, 4, 1, 5]] | (q[..., [2, 6, 3, 7]] << 4)
        lanes = np.ascontiguousarray(lanes).view(np.uint32)[..., 0]      # (N, K/32, 4)
        scale, offset = _scales(scale, offset)
        return Nibbles(*_records(_tiled(lanes, n), _tiled(scale, n), _tiled(offset, n)), n, k)
    if qtype in _BYTE_TYPES:
        q, *scales = _BYTE_TYPES[qtype](raw, n, k)
        blocks, size = q.shape[1:]
        lanes = q.reshape(n, blocks, size // 4, 4)[..., [0, 2, 1, 3]]
        lanes = np.ascontiguousarray(lanes).view(np.uint32)[..., 0]      # (N, blocks, size/4)
        parts = _records(_tiled(lanes, n), *(_tiled(part, n) for part in _scales(*scales)))
        return Bytes(parts[0], parts[1], parts[2] if len(parts) > 2 else None, n, k)
    raise ValueError(f"no CPU kernel for GGML type {qtype.name}")


# ---- kernels --------------------------------------------------------------------------
# Decoding multiplies integers: each int32 lane adds the products of pairs of int16
# (vectors.dot_pairs: pmaddwd, or vpdpwssd with AVX512-VNNI, 32 multiply-adds an
# instruction), the weights' values times x quantized a block at a time, and a block's
# sums become floats once. x is two int16 terms, x ~ scale * (high + low / 2^15): one
# alone (its error up to 1/65534 of the block's largest |x|) would make products about
# 1e-5 of their size apart from float ones, the second brings that below float32's own
# rounding, for twice the multiply-adds but the same unpacking of the weights and the
# same memory traffic, which is what decoding waits on. No block's sum wraps: |high| <=
# 32767, |low| <= 16384 and |w| <= 128 over at most 32 values, < 2^28.
_kernel = numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
_serial_kernel = numba.njit(fastmath=True, cache=True, nogil=True)
_inline = numba.njit(inline="always")

#: |high| of a block's largest value: int16, and never -32768 (a pair of -32768 times
#: -32768 is the one product of two pairs that would not fit an int32).
_X_MAX = 32767
#: low's unit, in units of high.
_LOW = 1.0 / 32768


@_serial_kernel
def _quantized_activations(x, size):
    """x in blocks of `size` values, x ~ scale * (high + low * _LOW): high and low as
    int16, a pair of neighbours in each int32 word (the first in the low half), each
    block's scale and the sum of its x (a block holding a NaN or an infinity gets the
    scale NaN, so that its products are NaN as float ones are)."""
    n = x.shape[0]
    bits = x.view(np.int32)  # fastmath assumes no NaN: found by their bits instead
    high = np.empty(n, np.int16)
    low = np.empty(n, np.int16)
    scale = np.empty(n // size, _F32)
    total = np.empty(n // size, _F32)
    for b in range(n // size):
        top = _F32(0)
        s = _F32(0)
        special = 0
        for i in range(b * size, (b + 1) * size):
            top = max(top, abs(x[i]))
            s += x[i]
            special |= bits[i] & 0x7F800000 == 0x7F800000
        total[b] = s
        scale[b] = top / _F32(_X_MAX) if not special else np.nan
        # of the float32 scale, in float64 (out of float32's range for a tiny scale)
        inverse = 1 / np.float64(scale[b]) if not special and scale[b] > 0 else 0.0
        for i in range(b * size, (b + 1) * size):
            v = x[i] * inverse
            h = np.rint(v)
            high[i] = np.int16(h)
            low[i] = np.int16(np.rint((v - h) / _LOW))  # v - h in -0.5..0.5
    return high.view(np.int32), low.view(np.int32), scale, total


@_inline
def _nibbles_dot(s, r, lanes, high, low, w):
    """(s, r) + the products of a lane's 8 nibbles (4 pairs) with the pairs of x
    words w..w+3 (high, low)."""
    pairs = nibble_pairs(lanes, 0)
    s, r = dot_pairs(s, pairs, high[w]), dot_pairs(r, pairs, low[w])
    pairs = nibble_pairs(lanes, 4)
    s, r = dot_pairs(s, pairs, high[w + 1]), dot_pairs(r, pairs, low[w + 1])
    pairs = nibble_pairs(lanes, 8)
    s, r = dot_pairs(s, pairs, high[w + 2]), dot_pairs(r, pairs, low[w + 2])
    pairs = nibble_pairs(lanes, 12)
    return dot_pairs(s, pairs, high[w + 3]), dot_pairs(r, pairs, low[w + 3])


@_inline
def _bytes_dot(s, r, lanes, high, low, w):
    """(s, r) + the products of a lane's 4 bytes (2 pairs) with the pairs of x words
    w, w + 1 (high, low)."""
    pairs = low_byte_pairs(lanes)
    s, r = dot_pairs(s, pairs, high[w]), dot_pairs(r, pairs, low[w])
    pairs = high_byte_pairs(lanes)
    return dot_pairs(s, pairs, high[w + 1]), dot_pairs(r, pairs, low[w + 1])


@_inline
def _sum(s, r, x_scale):
    """The sum of products of a block, from the sums with high (s) and low (r)."""
    return multiply_add(multiply_add(splat(0), s, x_scale), r, x_scale * _F32(_LOW))


@_inline
def _store_tile(a0, a1, a2, a3, t, y):
    """y[the rows of tile t that y holds] = the sums of its 4 groups of 16 rows."""
    first = t * TILE_ROWS
    whole = first + TILE_ROWS <= y.shape[0] and y.strides[0] == 4
    sums = y if whole else np.empty(TILE_ROWS, _F32)
    at = first if whole else 0
    store_floats(sums, (at,), a0)
    store_floats(sums, (at + 16,), a1)
    store_floats(sums, (at + 32,), a2)
    store_floats(sums, (at + 48,), a3)
    if not whole:
        for r in range(min(TILE_ROWS, y.shape[0] - first)):
            y[first + r] = sums[r]


@_kernel
def nibbles_matvec(q, scale, offset, x, y):
    """y[n] = sum_k w[n, k] x[k] for Nibbles (q, scale, offset); y holds the N outputs.
    A tile's rows are 4 vectors of 16 (a row a lane), each with its own sums."""
    tiles, blocks, groups, _ = q.shape
    high, low, x_scale, x_sum = _quantized_activations(x, 32)
    for tile in numba.prange(tiles):
        t = np.intp(tile)  # prange's index is unsigned
        a0 = a1 = a2 = a3 = splat(0)
        for b in range(blocks):
            s0 = s1 = s2 = s3 = r0 = r1 = r2 = r3 = zeros()
            for g in range(groups):
                w = b * 16 + g * 4
                s0, r0 = _nibbles_dot(s0, r0, load_ints(q, (t, b, g, 0)), high, low, w)
                s1, r1 = _nibbles_dot(s1, r1, load_ints(q, (t, b, g, 16)), high, low, w)
                s2, r2 = _nibbles_dot(s2, r2, load_ints(q, (t, b, g, 32)), high, low, w)
                s3, r3 = _nibbles_dot(s3, r3, load_ints(q, (t, b, g, 48)), high, low, w)
            f, xs = x_scale[b], x_sum[b]
            a0 = multiply_add(multiply_add(a0, _sum(s0, r0, f), load_floats(scale, (t, b, 0))),
                              load_floats(offset, (t, b, 0)), xs)
            a1 = multiply_add(multiply_add(a1, _sum(s1, r1, f), load_floats(scale, (t, b, 16))),
                              load_floats(offset, (t, b, 16)), xs)
            a2 = multiply_add(multiply_add(a2, _sum(s2, r2, f), load_floats(scale, (t, b, 32))),
                              load_floats(offset, (t, b, 32)), xs)
            a3 = multiply_add(multiply_add(a3, _sum(s3, r3, f), load_floats(scale, (t, b, 48))),
                              load_floats(offset, (t, b, 48)), xs)
        _store_tile(a0, a1, a2, a3, t, y)


@_kernel
def bytes_matvec(q, scale, offset, x, y):
    """y[n] = sum_k w[n, k] x[k] for Bytes (q, scale, offset or None); y holds the N
    outputs."""
    tiles, blocks, groups, _ = q.shape
    high, low, x_scale, x_sum = _quantized_activations(x, 4 * groups)
    for tile in numba.prange(tiles):
        t = np.intp(tile)
        a0 = a1 = a2 = a3 = splat(0)
        for b in range(blocks):
            s0 = s1 = s2 = s3 = r0 = r1 = r2 = r3 = zeros()
            for g in range(groups):
                w = (b * groups + g) * 2
                s0, r0 = _bytes_dot(s0, r0, load_ints(q, (t, b, g, 0)), high, low, w)
                s1, r1 = _bytes_dot(s1, r1, load_ints(q, (t, b, g, 16)), high, low, w)
                s2, r2 = _bytes_dot(s2, r2, load_ints(q, (t, b, g, 32)), high, low, w)
                s3, r3 = _bytes_dot(s3, r3, load_ints(q, (t, b, g, 48)), high, low, w)
            f = x_scale[b]
            a0 = multiply_add(a0, _sum(s0, r0, f), load_floats(scale, (t, b, 0)))
            a1 = multiply_add(a1, _sum(s1, r1, f), load_floats(scale, (t, b, 16)))
            a2 = multiply_add(a2, _sum(s2, r2, f), load_floats(scale, (t, b, 32)))
            a3 = multiply_add(a3, _sum(s3, r3, f), load_floats(scale, (t, b, 48)))
            if offset is not None:  # None compiles without this branch
                xs = x_sum[b]
                a0 = multiply_add(a0, load_floats(offset, (t, b, 0)), xs)
                a1 = multiply_add(a1, load_floats(offset, (t, b, 16)), xs)
                a2 = multiply_add(a2, load_floats(offset, (t, b, 32)), xs)
                a3 = multiply_add(a3, load_floats(offset, (t, b, 48)), xs)
        _store_tile(a0, a1, a2, a3, t, y)


# Dequantizing runs along rows too, 16 at a time, each value of a lane (a column of out)
# written as a vector where out's rows are contiguous: the prompt path dequantizes into
# a (K, rows) scratch, W^T, which BLAS multiplies as well as W.
@_inline
def _store_column(out, i, k, values, scratch):
    """out[i: i + 16, k] = values, as many of them as out holds."""
    count = out.shape[0] - i
    if count >= 16 and out.strides[0] == 4:
        store_floats(out, (i, k), values)
    else:
        store_floats(scratch, (0,), values)
        for r in range(min(count, 16)):
            out[i + r, k] = scratch[r]


@_serial_kernel
def nibbles_dequantize(q, scale, offset, first_tile, out):
    """Rows of tiles first_tile.. as float32 into out (rows, K), as many as it holds
    (fastest with out's rows contiguous: a Fortran-ordered array, or the .T of one)."""
    _, blocks, groups, _ = q.shape
    scratch = np.empty(16, _F32)
    for i in range(0, out.shape[0], 16):
        t = first_tile + i // TILE_ROWS
        r = i % TILE_ROWS
        for b in range(blocks):
            s = load_floats(scale, (t, b, r))
            o = load_floats(offset, (t, b, r))
            for g in range(groups):
                lanes = load_ints(q, (t, b, g, r))
                for j in range(8):  # value j: nibble j // 2 of half j % 2
                    values = multiply_add(o, nibbles(lanes, (j & 1) * 16 + (j >> 1) * 4), s)
                    _store_column(out, i, b * 32 + g * 8 + j, values, scratch)


@_serial_kernel
def bytes_dequantize(q, scale, offset, first_tile, out):
    """Rows of tiles first_tile.. as float32 into out (rows, K), as many as it holds
    (fastest with out's rows contiguous: a Fortran-ordered array, or the .T of one)."""
    _, blocks, groups, _ = q.shape
    scratch = np.empty(16, _F32)
    for i in range(0, out.shape[0], 16):
        t = first_tile + i // TILE_ROWS
        r = i % TILE_ROWS
        for b in range(blocks):
            s = load_floats(scale, (t, b, r))
            o = splat(0) if offset is None else load_floats(offset, (t, b, r))
            for g in range(groups):
                lanes = load_ints(q, (t, b, g, r))
                for j in range(4):  # value j: byte (j % 2) * 2 + j // 2 of the lane
                    values = multiply_add(o, signed_bytes(lanes, (j & 1) * 2 + (j >> 1)), s)
                    _store_column(out, i, (b * groups + g) * 4 + j, values, scratch)


def dequantize_rows(w: Nibbles | Bytes | Dense, first_tile: int, out: np.ndarray) -> None:
    """Fill out (rows, K) with the weight's rows from tile `first_tile` on."""
    if isinstance(w, Nibbles):
        nibbles_dequantize(w.q, w.scale, w.offset, first_tile, out)
    elif isinstance(w, Bytes):
        bytes_dequantize(w.q, w.scale, w.offset, first_tile, out)
    else:
        out[...] = w.w[first_tile * TILE_ROWS: first_tile * TILE_ROWS + out.shape[0]]


def matmul(x: np.ndarray, w: Nibbles | Bytes | Dense, out: np.ndarray | None = None) -> np.ndarray:
    """x (M, K) float32 @ W^T: (M, N) float32, into `out` when given."""
    x = np.ascontiguousarray(x, _F32)
    m = x.shape[0]
    out = np.empty((m, w.n), _F32) if out is None else out
    if isinstance(w, Dense):
        np.matmul(x, w.w.T, out=out)
        return out
    if m == 1:
        if isinstance(w, Nibbles):
            nibbles_matvec(w.q, w.scale, w.offset, x[0], out[0])
        else:
            bytes_matvec(w.q, w.scale, w.offset, x[0], out[0])
        return out
    tiles = -(-w.n // TILE_ROWS)
    threads = min(numba.get_num_threads(), tiles)
    share = -(-tiles // threads)
    jobs = [_pool(threads).submit(_product_of_tiles, x, w, t, min(t + share, tiles), out)
            for t in range(0, tiles, share)]
    for job in jobs:
        job.result()
    return out


def _product_of_tiles(x, w, first: int, stop: int, out) -> None:
    """out[:, rows of tiles first..stop-1] = x @ those rows^T, a few tiles at a time."""
    step = max(1, DEQUANTIZE_VALUES // (w.k * TILE_ROWS))
    scratch = np.empty((w.k, step * TILE_ROWS), _F32)  # W^T: rows contiguous
    for t in range(first, stop, step):
        row = t * TILE_ROWS
        rows = min(min(t + step, stop) * TILE_ROWS, w.n) - row
        dequantize_rows(w, t, scratch[:, :rows].T)
        np.matmul(x, scratch[:, :rows], out=out[:, row: row + rows])


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="pxvm-cpu")
        return _pools[threads]


def dequantize(w: Nibbles | Bytes | Dense) -> np.ndarray:
    """The whole weight as float32 (N, K) (tests compare it with gguf's dequantization)."""
    out = np.empty((w.n, w.k), _F32, order="F")
    dequantize_rows(w, 0, out)
    return np.ascontiguousarray(out)


def embed(raw: np.ndarray, ids: np.ndarray, qtype: str, k: int, first_row: int,
          out: np.ndarray) -> None:
    """out = rows `ids` of the raw GGUF weight, dequantized (by gguf: only those rows);
    the weight holds the table's rows first_row.., other ids give zeros."""
    rows = np.asarray(ids, np.int64) - first_row
    held = (rows >= 0) & (rows < raw.shape[0])
    values = quants.dequantize(raw[np.where(held, rows, 0)], T[qtype])
    out[...] = np.where(held[:, None], np.asarray(values, _F32).reshape(len(rows), k), 0)
