"""Products with GGUF-quantized weights on the CPU, computed on the quantized values.

A weight is repacked once, when first used, into one of two forms that SIMD code reads
well, both keeping its integer values:

- `Nibbles` (Q4_0, Q4_1, Q4_K): 4-bit values q in 0..15 with a float32 scale and offset
  per 32 values of a row (value = scale * q + offset), two values a byte;
- `Bytes` (Q8_0, Q6_K): 8-bit signed values with a float32 scale per block of a row
  (32 values for Q8_0, 16 for Q6_K; value = scale * q).

Rows are grouped in tiles of TILE_ROWS, and within a tile a byte of every row at one
position lies next to the others ([tile, block, byte, row]): the inner loop then runs
along rows, a SIMD lane each, with the activation broadcast, and never needs a sum
across lanes. Decoding (one row of activations) reads each weight byte once, on numba's
threads; prompts split the rows among as many Python threads, each dequantizing its
tiles to float32 and multiplying them by single-threaded BLAS (the CPU backend holds
BLAS to one thread while it runs: two thread pools on the same cores slow each other
down many times over).

Every function takes plain numpy arrays; pxvm.ops registers them as kernels of the
"cpu" backend, and tests compare them with the ops' numpy references.
"""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numba
import numpy as np
from gguf import quants
from gguf.constants import GGMLQuantizationType as T

#: Rows per tile: 64 float32 lanes are four AVX-512 or eight AVX2 registers of sums.
TILE_ROWS = 64
#: Each prompt thread dequantizes at most this many weight values at a time (a float32
#: scratch of 4 MiB) before each BLAS product, so a large LM head needs no copy of its own.
DEQUANTIZE_VALUES = 1 << 20

_F32 = np.float32


@dataclass(frozen=True)
class Nibbles:
    """4-bit values: q (tiles, K / 32, 16, TILE_ROWS) uint8, byte j of a block holding
    values j (low nibble) and j + 16 (high nibble); scale and offset (tiles, K / 32,
    TILE_ROWS) float32."""

    q: np.ndarray
    scale: np.ndarray
    offset: np.ndarray
    n: int
    k: int


@dataclass(frozen=True)
class Bytes:
    """8-bit values: q (tiles, K / block, block, TILE_ROWS) int8; scale (tiles, K / block,
    TILE_ROWS) float32."""

    q: np.ndarray
    scale: np.ndarray
    n: int
    k: int


@dataclass(frozen=True)
class Dense:
    """float32 (N, K): F32 and F16 weights, multiplied by BLAS."""

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


def _split_q4_k(raw, n, k):
    """Q4_K super-blocks (256 values: f16 d and dmin, 12 bytes of 6-bit scales and mins,
    128 bytes of nibbles) as 8 blocks of 32 values with scale d*sc and offset -dmin*m."""
    b = raw.reshape(n, k // 256, 144)
    d, dmin = _f16(b, 0), _f16(b, 2)
    s = b[..., 4:16].astype(np.uint8)
    lo, hi, mix = s[..., 0:4], s[..., 4:8], s[..., 8:12]
    sc = np.concatenate([lo & 63, (mix & 15) | ((lo >> 6) << 4)], axis=-1).astype(_F32)
    mn = np.concatenate([hi & 63, (mix >> 4) | ((hi >> 6) << 4)], axis=-1).astype(_F32)
    # each 32 bytes of nibbles hold 64 values: 32 in the low nibbles, then 32 in the high
    qs = b[..., 16:].reshape(n, k // 256, 4, 1, 32)
    q = np.concatenate([qs & 15, qs >> 4], axis=3).reshape(n, k // 32, 32)
    scale = (d[..., None] * sc).reshape(n, k // 32)
    offset = (-dmin[..., None] * mn).reshape(n, k // 32)
    return q, scale, offset


def _split_q8_0(raw, n, k):
    b = raw.reshape(n, k // 32, 34)
    return np.ascontiguousarray(b[..., 2:]).view(np.int8), _f16(b, 0)


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
_BYTE_TYPES = {T.Q8_0: _split_q8_0, T.Q6_K: _split_q6_k}
#: The GGML types this module multiplies by.
TYPES = (T.F32, T.F16, *_NIBBLE_TYPES, *_BYTE_TYPES)


def _tiled(a: np.ndarray, n: int) -> np.ndarray:
    """(N, blocks, ...) -> (tiles, blocks, ..., TILE_ROWS), rows zero-padded to a tile."""
    tiles = -(-n // TILE_ROWS)
    padded = np.zeros((tiles * TILE_ROWS, *a.shape[1:]), a.dtype)
    padded[:n] = a
    padded = padded.reshape(tiles, TILE_ROWS, *a.shape[1:])
    return np.ascontiguousarray(np.moveaxis(padded, 1, -1))


def pack(raw: np.ndarray, qtype: int, k: int) -> Nibbles | Bytes | Dense:
    """The raw GGUF rows (N, row bytes) of a weight of type `qtype`, `k` values a row,
    repacked for the products here."""
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.shape[0]
    qtype = T(qtype)
    if qtype in (T.F32, T.F16):
        values = raw.view(np.float32 if qtype == T.F32 else np.float16).reshape(n, k)
        return Dense(np.ascontiguousarray(values, _F32), n, k)
    if qtype in _NIBBLE_TYPES:
        q, scale, offset = _NIBBLE_TYPES[qtype](raw, n, k)
        q = q.astype(np.uint8)
        packed = q[..., :16] | (q[..., 16:] << 4)                       # (N, K/32, 16)
        return Nibbles(_tiled(packed, n), _tiled(scale.astype(_F32), n),
                       _tiled(offset.astype(_F32), n), n, k)
    if qtype in _BYTE_TYPES:
        q, scale = _BYTE_TYPES[qtype](raw, n, k)
        return Bytes(_tiled(q, n), _tiled(scale.astype(_F32), n), n, k)
    raise ValueError(f"no CPU kernel for GGML type {qtype.name}")


# ---- kernels --------------------------------------------------------------------------
# fastmath lets LLVM reorder the float sums (as BLAS does) so that it can vectorize them.
# Nibbles are split in float arithmetic, hi = floor(v / 16): numba widens integer
# arithmetic to 64 bits, which would halve the SIMD lanes (and quarter them for bytes).
_kernel = numba.njit(parallel=True, fastmath=True, cache=True, nogil=True)


@_kernel
def nibbles_matvec(q, scale, offset, x, y):
    """y[n] = sum_k w[n, k] x[k] for Nibbles (q, scale, offset); y holds the N outputs.

    A byte v = lo + 16 hi holds values j and j + 16, so lo x[j] + hi x[j + 16] =
    v x[j] + hi (x[j + 16] - 16 x[j]): the low nibble is never split off."""
    tiles, blocks, _, rows = q.shape
    n = y.shape[0]
    xsum = np.empty(blocks, _F32)
    for b in range(blocks):
        s = _F32(0)
        for i in range(32):
            s += x[b * 32 + i]
        xsum[b] = s
    for t in numba.prange(tiles):
        acc = np.zeros(rows, _F32)
        part = np.empty(rows, _F32)
        for b in range(blocks):
            part[:] = 0
            base = b * 32
            for j in range(0, 16, 2):
                x0 = x[base + j]
                x1 = x[base + j + 16] - _F32(16) * x0
                x2 = x[base + j + 1]
                x3 = x[base + j + 17] - _F32(16) * x2
                for r in range(rows):
                    v0 = _F32(q[t, b, j, r])
                    v1 = _F32(q[t, b, j + 1, r])
                    part[r] += (v0 * x0 + np.floor(v0 * _F32(0.0625)) * x1
                                + v1 * x2 + np.floor(v1 * _F32(0.0625)) * x3)
            for r in range(rows):
                acc[r] += scale[t, b, r] * part[r] + offset[t, b, r] * xsum[b]
        for r in range(min(rows, n - t * rows)):
            y[t * rows + r] = acc[r]


@_kernel
def bytes_matvec(q, scale, x, y):
    """y[n] = sum_k w[n, k] x[k] for Bytes (q, scale); y holds the N outputs."""
    tiles, blocks, size, rows = q.shape
    n = y.shape[0]
    for t in numba.prange(tiles):
        acc = np.zeros(rows, _F32)
        part = np.empty(rows, _F32)
        for b in range(blocks):
            part[:] = 0
            base = b * size
            for j in range(0, size, 2):
                x0 = x[base + j]
                x1 = x[base + j + 1]
                for r in range(rows):
                    part[r] += _F32(q[t, b, j, r]) * x0 + _F32(q[t, b, j + 1, r]) * x1
            for r in range(rows):
                acc[r] += scale[t, b, r] * part[r]
        for r in range(min(rows, n - t * rows)):
            y[t * rows + r] = acc[r]


_serial_kernel = numba.njit(fastmath=True, cache=True, nogil=True)


@_serial_kernel
def nibbles_dequantize(q, scale, offset, first_tile, out):
    """Rows of tiles first_tile.. as float32 into out (rows, K), as many as it holds."""
    _, blocks, _, rows = q.shape
    for i in range(out.shape[0]):
        t = first_tile + i // rows
        r = i % rows
        for b in range(blocks):
            s = scale[t, b, r]
            o = offset[t, b, r]
            for j in range(16):
                v = q[t, b, j, r]
                out[i, b * 32 + j] = s * _F32(v & 15) + o
                out[i, b * 32 + j + 16] = s * _F32(v >> 4) + o


@_serial_kernel
def bytes_dequantize(q, scale, first_tile, out):
    """Rows of tiles first_tile.. as float32 into out (rows, K), as many as it holds."""
    _, blocks, size, rows = q.shape
    for i in range(out.shape[0]):
        t = first_tile + i // rows
        r = i % rows
        for b in range(blocks):
            s = scale[t, b, r]
            for j in range(size):
                out[i, b * size + j] = s * _F32(q[t, b, j, r])


def dequantize_rows(w: Nibbles | Bytes | Dense, first_tile: int, out: np.ndarray) -> None:
    """Fill out (rows, K) with the weight's rows from tile `first_tile` on."""
    if isinstance(w, Nibbles):
        nibbles_dequantize(w.q, w.scale, w.offset, first_tile, out)
    elif isinstance(w, Bytes):
        bytes_dequantize(w.q, w.scale, first_tile, out)
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
            bytes_matvec(w.q, w.scale, x[0], out[0])
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
    scratch = np.empty((step * TILE_ROWS, w.k), _F32)
    for t in range(first, stop, step):
        row = t * TILE_ROWS
        rows = min(min(t + step, stop) * TILE_ROWS, w.n) - row
        dequantize_rows(w, t, scratch[:rows])
        np.matmul(x, scratch[:rows].T, out=out[:, row: row + rows])


_pools: dict[int, ThreadPoolExecutor] = {}
_pools_lock = threading.Lock()


def _pool(threads: int) -> ThreadPoolExecutor:
    with _pools_lock:
        if threads not in _pools:
            _pools[threads] = ThreadPoolExecutor(threads, thread_name_prefix="pxvm-cpu")
        return _pools[threads]


def dequantize(w: Nibbles | Bytes | Dense) -> np.ndarray:
    """The whole weight as float32 (N, K) (tests compare it with gguf's dequantization)."""
    out = np.empty((w.n, w.k), _F32)
    dequantize_rows(w, 0, out)
    return out


def embed(raw: np.ndarray, ids: np.ndarray, qtype: int, k: int, out: np.ndarray) -> None:
    """out = rows `ids` of the raw GGUF weight, dequantized (by gguf: only those rows)."""
    rows = raw[np.asarray(ids, np.int64)]
    out[...] = np.asarray(quants.dequantize(rows, T(qtype)), _F32).reshape(len(rows), k)


def matmul_into(x: np.ndarray, w: Nibbles | Bytes | Dense, out: np.ndarray) -> None:
    matmul(x, w, out)
