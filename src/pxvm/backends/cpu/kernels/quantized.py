"""Products with GGUF-quantized weights on the CPU, computed on the quantized values.

A weight is repacked once, when first used, into one of two forms that SIMD code reads
well, both keeping its integer values:

- `Nibbles` (Q4_0, Q4_1, Q4_K): 4-bit values q in 0..15 with a scale and an offset per
  32 values of a row (value = scale * q + offset); Q4_K's as its own 6-bit integers
  (bytes) times a float16 unit per 256 values of a row, as the file has them, so that it
  takes 4.6 bits a value rather than 5;
- `Bytes` (Q5_0, Q5_1, Q8_0, Q2_K, Q3_K, Q5_K): 8-bit signed values with a scale per
  block of a row (32 values, 16 for Q2_K and Q3_K; value = scale * q), and an offset for
  Q5_1, Q2_K and Q5_K (value = scale * q + offset);
- `SixBits` (Q6_K): 6-bit values q in 0..63 as Nibbles' 4-bit lanes and a lane of their
  high 2 bits, with a scale per 16 values of a row (value = scale * (q - 32)): 7 bits a
  value where Bytes would take 9, for the type of most large models' output and of half
  their down projections.

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
    prefetch,
    signed_bytes,
    six_bit_pairs,
    six_bits,
    splat,
    store_floats,
    zeros,
)

#: Rows per tile: 64 int32 or float32 lanes are four AVX-512 or eight AVX2 registers of
#: sums (the kernels spell out its 4 vectors of 16 rows).
TILE_ROWS = 64
#: Each prompt thread dequantizes at most this many weight values at a time (a float32
#: scratch of 1 MiB, which stays in a core's L2 cache for BLAS to read; 4 MiB measured
#: 10% slower) before each BLAS product, so a large LM head needs no copy of its own.
DEQUANTIZE_VALUES = 1 << 18

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
    #: For Q4_K: scale and offset are uint8 integers, to be multiplied by these units
    #: (tiles, K / 256, TILE_ROWS) float16 bits, one a row for each 256 values.
    scale_unit: np.ndarray | None = None
    offset_unit: np.ndarray | None = None


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
class SixBits:
    """6-bit values, 16 a block: q (tiles, K / 16, 2, TILE_ROWS) uint32 of their low 4
    bits, lane [t, b, g, r] laid out as Nibbles' (values 8g..8g+7 of block b of row r);
    crumbs (tiles, K / 16, TILE_ROWS) uint32 of their high 2 bits, value 8g + 2i + h at
    bit CRUMB_AT[4g + i] of half h; scale (tiles, K / 16, TILE_ROWS), float32 or float16
    bits (HALF). All three are views into one buffer, a record per tile and block."""

    q: np.ndarray
    crumbs: np.ndarray
    scale: np.ndarray
    n: int
    k: int


#: Where SixBits keeps the high 2 bits of a value in its half of a crumbs lane, by 4g + i
#: (value 8g + 2i + h): at bits 4.. for group 0, so that a right shift and a mask put
#: them above the value's nibble (bits 4..5); group 1 fills the rest.
CRUMB_AT = (4, 6, 8, 10, 12, 14, 0, 2)


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
    """The (scale, offset) of each 32-value block of Q5_K super-blocks `b` (f16 d and
    dmin, then 12 bytes of 6-bit scales and mins): d * sc and -dmin * m."""
    d, dmin = _f16(b, 0), _f16(b, 2)
    sc, mn = (v.astype(_F32) for v in _k_integers(b))
    n = b.shape[0]
    return (d[..., None] * sc).reshape(n, -1), (-dmin[..., None] * mn).reshape(n, -1)


def _k_nibbles(qs, n, k):
    """Q4_K / Q5_K's 128 bytes of nibbles a super-block as 8 blocks of 32 values: each 32
    bytes hold 64 values, 32 in the low nibbles, then 32 in the high."""
    qs = qs.reshape(n, k // 256, 4, 1, 32)
    return np.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, k // 32, 32)


def _k_integers(b):
    """The 6-bit scales sc and mins m of each 32-value block of Q4_K / Q5_K super-blocks
    `b` (12 bytes after f16 d and dmin), as uint8 (super-block, block)."""
    s = b[..., 4:16].astype(np.uint8)
    lo, hi, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (mix & 15) | ((lo >> 6) << 4)], axis=-1)
    mn = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 6) << 4)], axis=-1)
    return sc, mn


def _split_q4_k(raw, n, k):
    """Q4_K super-blocks (256 values: f16 d and dmin, 12 bytes of 6-bit scales and mins,
    128 bytes of nibbles) as 8 blocks of 32 values with scale d*sc and offset -dmin*m: the
    values, sc and m (N, K / 32) uint8, d and -dmin (N, K / 256) float16."""
    b = raw.reshape(n, k // 256, 144)
    sc, mn = _k_integers(b)
    d = np.ascontiguousarray(b[..., 0:2]).view(np.float16)[..., 0]
    dmin = np.ascontiguousarray(b[..., 2:4]).view(np.float16)[..., 0]
    return (_k_nibbles(b[..., 16:], n, k), sc.reshape(n, -1), mn.reshape(n, -1), d, -dmin)


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


_NIBBLE_TYPES = {T.Q4_0: _split_q4_0, T.Q4_1: _split_q4_1}
_BYTE_TYPES = {T.Q5_0: _split_q5_0, T.Q5_1: _split_q5_1, T.Q8_0: _split_q8_0,
               T.Q2_K: _split_q2_k, T.Q3_K: _split_q3_k, T.Q5_K: _split_q5_k}
#: The GGML types this module multiplies by.
TYPES = (T.F32, T.F16, T.BF16, *_NIBBLE_TYPES, T.Q4_K, *_BYTE_TYPES, T.Q6_K)


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


def _nibble_lanes(q: np.ndarray) -> np.ndarray:
    """Values q (..., groups * 8) in 0..15 as Nibbles' lanes (..., groups) uint32: value
    8g + 2i + h in bits 4i.. of half h of lane g, so the lane's bytes hold values (0, 2),
    (4, 6), (1, 3), (5, 7) of the group, low nibble first."""
    q = q.astype(np.uint8).reshape(*q.shape[:-1], -1, 8)
    lanes = q[..., [0, 4, 1, 5]] | (q[..., [2, 6, 3, 7]] << 4)
    return np.ascontiguousarray(lanes).view(np.uint32)[..., 0]


def _crumb_lanes(high: np.ndarray) -> np.ndarray:
    """High 2 bits (..., 16) of a SixBits block as its crumbs lane (...) uint32."""
    high = high.astype(np.uint32).reshape(*high.shape[:-1], 8, 2)   # [.., 4g + i, h]
    lanes = np.zeros(high.shape[:-2], np.uint32)
    for j, at in enumerate(CRUMB_AT):
        lanes |= (high[..., j, 0] << at) | (high[..., j, 1] << (at + 16))
    return lanes


def pack(raw: np.ndarray, qtype: str, k: int) -> Nibbles | Bytes | SixBits | Dense:
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
    if qtype == T.Q4_K:
        q, sc, mn, d, minus_dmin = _split_q4_k(raw, n, k)
        units = _records(_tiled(d.view(HALF), n), _tiled(minus_dmin.view(HALF), n))
        return Nibbles(*_records(_tiled(_nibble_lanes(q), n), _tiled(sc, n), _tiled(mn, n)),
                       n, k, *units)
    if qtype in _NIBBLE_TYPES:
        q, scale, offset = _NIBBLE_TYPES[qtype](raw, n, k)
        lanes = _nibble_lanes(q)                                          # (N, K/32, 4)
        scale, offset = _scales(scale, offset)
        return Nibbles(*_records(_tiled(lanes, n), _tiled(scale, n), _tiled(offset, n)), n, k)
    if qtype in _BYTE_TYPES:
        q, *scales = _BYTE_TYPES[qtype](raw, n, k)
        blocks, size = q.shape[1:]
        lanes = q.reshape(n, blocks, size // 4, 4)[..., [0, 2, 1, 3]]
        lanes = np.ascontiguousarray(lanes).view(np.uint32)[..., 0]      # (N, blocks, size/4)
        parts = _records(_tiled(lanes, n), *(_tiled(part, n) for part in _scales(*scales)))
        return Bytes(parts[0], parts[1], parts[2] if len(parts) > 2 else None, n, k)
    if qtype == T.Q6_K:
        q, scale = _split_q6_k(raw, n, k)
        values = (q.astype(np.int16) + 32).astype(np.uint8)                # 0..63
        parts = _records(_tiled(_nibble_lanes(values & 15), n),
                         _tiled(_crumb_lanes(values >> 4), n), _tiled(_scales(scale)[0], n))
        return SixBits(*parts, n, k)
    raise ValueError(f"no CPU kernel for GGML type {qtype.name}")


# ---- kernels --------------------------------------------------------------------------
# Decoding multiplies integers: each int32 lane adds the products of pairs of int16
# (vectors.dot_pairs: pmaddwd, or vpdpwssd with AVX512-VNNI, 32 multiply-adds an
# instruction), the weights' values times x quantized a block at a time, and a block's
# sums become floats once. x is one or two int16 terms, x ~ scale * (high + low / 2^15).
# high alone errs by up to 1/65534 of the block's largest |x|: where that is within
# ONE_TERM_PEAK times the block's mean |x|, at most 1.3e-4 of it (products about 1e-9
# of float ones apart, NMSE), and one term it is, for a third fewer instructions
# (decoding waits on them on AVX2 without VNNI, not only on memory). A block with an
# outlier (LLM activations have features 100-1000x the rest) takes the second term too,
# which brings the others' products below float32's own rounding. No block's sum
# wraps: |high| <= 32767, |low| <= 16384 and |w| <= 128 over at most 32 values, < 2^28.
_kernel = numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)
_serial_kernel = numba.njit(fastmath=True, cache=True, nogil=True)
_inline = numba.njit(inline="always")

#: |high| of a block's largest value: int16, and never -32768 (a pair of -32768 times
#: -32768 is the one product of two pairs that would not fit an int32).
_X_MAX = 32767
#: low's unit, in units of high.
_LOW = 1.0 / 32768
#: A block whose largest |x| is at most this many times its mean |x| takes one term
#: (see above; Gaussian blocks of 32: about 3-4).
ONE_TERM_PEAK = 8.0
#: Decoding asks for the records of the block this many ahead of the one it multiplies:
#: the hardware's prefetchers stop at each 4 KiB page, and a token streams the whole
#: model from memory (1B-shaped file, 2 AVX2 threads: 12-13 -> 16-20 tokens/s).
PREFETCH_BLOCKS = 4


@_serial_kernel
def _quantized_activations(x, size):
    """x in blocks of `size` values, x ~ scale * (high + low * _LOW): high and low as
    int16, a pair of neighbours in each int32 word (the first in the low half), each
    block's scale, the sum of its x and whether it takes both terms (a block holding a
    NaN or an infinity gets the scale NaN, so that its products are NaN as float ones
    are)."""
    n = x.shape[0]
    bits = x.view(np.int32)  # fastmath assumes no NaN: found by their bits instead
    high = np.empty(n, np.int16)
    low = np.empty(n, np.int16)
    scale = np.empty(n // size, _F32)
    total = np.empty(n // size, _F32)
    both = np.empty(n // size, np.bool_)
    for b in range(n // size):
        top = _F32(0)
        s = _F32(0)
        magnitude = _F32(0)
        special = 0
        for i in range(b * size, (b + 1) * size):
            top = max(top, abs(x[i]))
            s += x[i]
            magnitude += abs(x[i])
            special |= bits[i] & 0x7F800000 == 0x7F800000
        total[b] = s
        scale[b] = top / _F32(_X_MAX) if not special else np.nan
        both[b] = top * size > _F32(ONE_TERM_PEAK) * magnitude
        # of the float32 scale, in float64 (out of float32's range for a tiny scale)
        inverse = 1 / np.float64(scale[b]) if not special and scale[b] > 0 else 0.0
        for i in range(b * size, (b + 1) * size):
            v = x[i] * inverse
            h = np.rint(v)
            high[i] = np.int16(h)
            low[i] = np.int16(np.rint((v - h) / _LOW))  # v - h in -0.5..0.5
    return high.view(np.int32), low.view(np.int32), scale, total, both


@_inline
def _nibbles_block(s, q, unused, t, b, r, x):
    """s + the products of block b of rows r..r+15 of tile t (Nibbles: 4 lanes of 8
    values) with x's words 16b.. (a pair each)."""
    for g in range(4):
        lanes = load_ints(q, (t, b, g, r))
        w = b * 16 + g * 4
        s = dot_pairs(s, nibble_pairs(lanes, 0), x[w])
        s = dot_pairs(s, nibble_pairs(lanes, 4), x[w + 1])
        s = dot_pairs(s, nibble_pairs(lanes, 8), x[w + 2])
        s = dot_pairs(s, nibble_pairs(lanes, 12), x[w + 3])
    return s


@_inline
def _bytes_block(s, q, unused, t, b, r, x):
    """s + the products of block b of rows r..r+15 of tile t (Bytes: lanes of 4 values)
    with x's words from b * lanes a block * 2 on."""
    groups = q.shape[2]
    for g in range(groups):
        lanes = load_ints(q, (t, b, g, r))
        w = (b * groups + g) * 2
        s = dot_pairs(s, low_byte_pairs(lanes), x[w])
        s = dot_pairs(s, high_byte_pairs(lanes), x[w + 1])
    return s


@_inline
def _six_bits_block(s, q, crumbs, t, b, r, x):
    """s + the products of block b of rows r..r+15 of tile t (SixBits: 2 nibble lanes and
    a crumbs lane of 16 values) with x's words 8b.. (shifts of CRUMB_AT, less 4)."""
    c = load_ints(crumbs, (t, b, r))
    first, second = load_ints(q, (t, b, 0, r)), load_ints(q, (t, b, 1, r))
    w = b * 8
    s = dot_pairs(s, six_bit_pairs(first, 0, c, 0), x[w])
    s = dot_pairs(s, six_bit_pairs(first, 4, c, 2), x[w + 1])
    s = dot_pairs(s, six_bit_pairs(first, 8, c, 4), x[w + 2])
    s = dot_pairs(s, six_bit_pairs(first, 12, c, 6), x[w + 3])
    s = dot_pairs(s, six_bit_pairs(second, 0, c, 8), x[w + 4])
    s = dot_pairs(s, six_bit_pairs(second, 4, c, 10), x[w + 5])
    s = dot_pairs(s, six_bit_pairs(second, 8, c, -4), x[w + 6])
    return dot_pairs(s, six_bit_pairs(second, 12, c, -2), x[w + 7])


@_inline
def _block_sums(q, extra, t, b, high, low, both, x_scale, block):
    """The sums of products of block b of tile t's 4 groups of 16 rows with x, as floats:
    `block`'s products (one of the three above) with high, and with low too where the
    block takes both terms."""
    ahead = b + PREFETCH_BLOCKS
    if ahead < q.shape[1]:
        for line in range(0, q.strides[1], 64):  # the whole record: values and scales
            prefetch(q, (t, ahead, 0, 0), line)
    f = x_scale[b]
    v0 = multiply_add(splat(0), block(zeros(), q, extra, t, b, 0, high), f)
    v1 = multiply_add(splat(0), block(zeros(), q, extra, t, b, 16, high), f)
    v2 = multiply_add(splat(0), block(zeros(), q, extra, t, b, 32, high), f)
    v3 = multiply_add(splat(0), block(zeros(), q, extra, t, b, 48, high), f)
    if both[b]:  # the same for every lane: a branch that is taken or not for the block
        f = f * _F32(_LOW)
        v0 = multiply_add(v0, block(zeros(), q, extra, t, b, 0, low), f)
        v1 = multiply_add(v1, block(zeros(), q, extra, t, b, 16, low), f)
        v2 = multiply_add(v2, block(zeros(), q, extra, t, b, 32, low), f)
        v3 = multiply_add(v3, block(zeros(), q, extra, t, b, 48, low), f)
    return v0, v1, v2, v3


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


@_inline
def _scaled(scale, unit, t, b, r):
    """The scales (or offsets) of block b of rows r..r+15 of tile t, times their units
    (one per 256 values) where the weight has them."""
    v = load_floats(scale, (t, b, r))
    if unit is None:  # None compiles without this branch
        return v
    return multiply_add(splat(0), v, load_floats(unit, (t, b * 32 // 256, r)))


@_kernel
def nibbles_matvec(q, scale, offset, scale_unit, offset_unit, x, y):
    """y[n] = sum_k w[n, k] x[k] for Nibbles (q, scale, offset, and their units or None);
    y holds the N outputs. A tile's rows are 4 vectors of 16 (a row a lane), each with
    its own sums."""
    tiles, blocks = q.shape[:2]
    high, low, x_scale, x_sum, both = _quantized_activations(x, 32)
    for tile in numba.prange(tiles):
        t = np.intp(tile)  # prange's index is unsigned
        a0 = a1 = a2 = a3 = splat(0)
        for b in range(blocks):
            v0, v1, v2, v3 = _block_sums(q, q, t, b, high, low, both, x_scale, _nibbles_block)
            xs = x_sum[b]
            a0 = multiply_add(multiply_add(a0, v0, _scaled(scale, scale_unit, t, b, 0)),
                              _scaled(offset, offset_unit, t, b, 0), xs)
            a1 = multiply_add(multiply_add(a1, v1, _scaled(scale, scale_unit, t, b, 16)),
                              _scaled(offset, offset_unit, t, b, 16), xs)
            a2 = multiply_add(multiply_add(a2, v2, _scaled(scale, scale_unit, t, b, 32)),
                              _scaled(offset, offset_unit, t, b, 32), xs)
            a3 = multiply_add(multiply_add(a3, v3, _scaled(scale, scale_unit, t, b, 48)),
                              _scaled(offset, offset_unit, t, b, 48), xs)
        _store_tile(a0, a1, a2, a3, t, y)


@_kernel
def bytes_matvec(q, scale, offset, x, y):
    """y[n] = sum_k w[n, k] x[k] for Bytes (q, scale, offset or None); y holds the N
    outputs."""
    tiles, blocks, groups, _ = q.shape
    high, low, x_scale, x_sum, both = _quantized_activations(x, 4 * groups)
    for tile in numba.prange(tiles):
        t = np.intp(tile)
        a0 = a1 = a2 = a3 = splat(0)
        for b in range(blocks):
            v0, v1, v2, v3 = _block_sums(q, q, t, b, high, low, both, x_scale, _bytes_block)
            a0 = multiply_add(a0, v0, load_floats(scale, (t, b, 0)))
            a1 = multiply_add(a1, v1, load_floats(scale, (t, b, 16)))
            a2 = multiply_add(a2, v2, load_floats(scale, (t, b, 32)))
            a3 = multiply_add(a3, v3, load_floats(scale, (t, b, 48)))
            if offset is not None:  # None compiles without this branch
                xs = x_sum[b]
                a0 = multiply_add(a0, load_floats(offset, (t, b, 0)), xs)
                a1 = multiply_add(a1, load_floats(offset, (t, b, 16)), xs)
                a2 = multiply_add(a2, load_floats(offset, (t, b, 32)), xs)
                a3 = multiply_add(a3, load_floats(offset, (t, b, 48)), xs)
        _store_tile(a0, a1, a2, a3, t, y)


@_kernel
def six_bits_matvec(q, crumbs, scale, x, y):
    """y[n] = sum_k w[n, k] x[k] for SixBits (q, crumbs, scale); y holds the N outputs."""
    tiles, blocks = q.shape[:2]
    high, low, x_scale, x_sum, both = _quantized_activations(x, 16)
    for tile in numba.prange(tiles):
        t = np.intp(tile)
        a0 = a1 = a2 = a3 = splat(0)
        for b in range(blocks):
            v0, v1, v2, v3 = _block_sums(q, crumbs, t, b, high, low, both, x_scale,
                                         _six_bits_block)
            m = _F32(-32) * x_sum[b]  # value = scale * (q - 32)
            s0, s1 = load_floats(scale, (t, b, 0)), load_floats(scale, (t, b, 16))
            s2, s3 = load_floats(scale, (t, b, 32)), load_floats(scale, (t, b, 48))
            a0 = multiply_add(multiply_add(a0, v0, s0), s0, m)
            a1 = multiply_add(multiply_add(a1, v1, s1), s1, m)
            a2 = multiply_add(multiply_add(a2, v2, s2), s2, m)
            a3 = multiply_add(multiply_add(a3, v3, s3), s3, m)
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
def nibbles_dequantize(q, scale, offset, scale_unit, offset_unit, first_tile, out):
    """Rows of tiles first_tile.. as float32 into out (rows, K), as many as it holds
    (fastest with out's rows contiguous: a Fortran-ordered array, or the .T of one)."""
    _, blocks, groups, _ = q.shape
    scratch = np.empty(16, _F32)
    for i in range(0, out.shape[0], 16):
        t = first_tile + i // TILE_ROWS
        r = i % TILE_ROWS
        for b in range(blocks):
            s = _scaled(scale, scale_unit, t, b, r)
            o = _scaled(offset, offset_unit, t, b, r)
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


@_serial_kernel
def six_bits_dequantize(q, crumbs, scale, first_tile, out):
    """Rows of tiles first_tile.. as float32 into out (rows, K), as many as it holds
    (fastest with out's rows contiguous: a Fortran-ordered array, or the .T of one)."""
    blocks = q.shape[1]
    scratch = np.empty(16, _F32)
    for i in range(0, out.shape[0], 16):
        t = first_tile + i // TILE_ROWS
        r = i % TILE_ROWS
        for b in range(blocks):
            s = load_floats(scale, (t, b, r))
            o = multiply_add(splat(0), s, -32.0)
            c = load_ints(crumbs, (t, b, r))
            for g in range(2):
                lanes = load_ints(q, (t, b, g, r))
                for j in range(8):  # value 8g + j: nibble j // 2 of half j % 2
                    at = CRUMB_AT[4 * g + (j >> 1)] + (j & 1) * 16
                    values = six_bits(lanes, (j & 1) * 16 + (j >> 1) * 4, c, at)
                    _store_column(out, i, b * 16 + g * 8 + j, multiply_add(o, values, s),
                                  scratch)


def dequantize_rows(w: Nibbles | Bytes | SixBits | Dense, first_tile: int,
                    out: np.ndarray) -> None:
    """Fill out (rows, K) with the weight's rows from tile `first_tile` on."""
    if isinstance(w, Nibbles):
        nibbles_dequantize(w.q, w.scale, w.offset, w.scale_unit, w.offset_unit, first_tile,
                           out)
    elif isinstance(w, Bytes):
        bytes_dequantize(w.q, w.scale, w.offset, first_tile, out)
    elif isinstance(w, SixBits):
        six_bits_dequantize(w.q, w.crumbs, w.scale, first_tile, out)
    else:
        out[...] = w.w[first_tile * TILE_ROWS: first_tile * TILE_ROWS + out.shape[0]]


def matmul(x: np.ndarray, w: Nibbles | Bytes | SixBits | Dense,
           out: np.ndarray | None = None) -> np.ndarray:
    """x (M, K) float32 @ W^T: (M, N) float32, into `out` when given."""
    x = np.ascontiguousarray(x, _F32)
    m = x.shape[0]
    out = np.empty((m, w.n), _F32) if out is None else out
    if isinstance(w, Dense):
        np.matmul(x, w.w.T, out=out)
        return out
    if m == 1:
        if isinstance(w, Nibbles):
            nibbles_matvec(w.q, w.scale, w.offset, w.scale_unit, w.offset_unit, x[0], out[0])
        elif isinstance(w, SixBits):
            six_bits_matvec(w.q, w.crumbs, w.scale, x[0], out[0])
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


def dequantize(w: Nibbles | Bytes | SixBits | Dense) -> np.ndarray:
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
