"""Exact products of 8-bit integer matrices (uint8 @ uint8, int8 @ int8) on the CPU.

pxVM's MATMUL and MATMUL_I8 need every sum exactly. numpy has no fast integer matmul,
and numba's own loops multiply 32-bit lanes (vpmulld: measured no faster than float32
BLAS on blocks small enough to stay exact). Here the inner step is written as LLVM
vector code instead: 16 columns of sums, each adding the products of a pair of
consecutive k, the 8-bit values widened to int16. LLVM compiles that pattern to pmaddwd,
or to vpdpwssd where the CPU has AVX512-VNNI: 32 exact multiply-adds an instruction.

B is packed once into panels of 32 columns, a pair of k next to each other
([panel, k / 2, 2 * column + k % 2], zero-padded), a byte an element; rows of A are
packed a block at a time into int32 words holding a pair of int16. A tile of the result,
4 rows by 32 columns, stays in 8 vector registers for the whole sum over k. A B of fewer
than NARROW columns is multiplied a sum at a time instead (panels would be mostly zeros).

Sums wrap modulo 2^32 and are exact in the result's dtype: int32 for int8 operands
(|sum| <= 128 * 128 * 65535 < 2^30), uint32 for uint8 ones (sum <= 255^2 * 65535 < 2^32).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from .vectors import dot_pairs, load_byte_pairs, store_ints, zeros

#: Columns of a panel: two vectors of 16 sums.
PANEL = 32
#: Rows of a tile.
TILE_ROWS = 4
#: B with fewer columns is multiplied a sum at a time (measured: faster below 12 columns).
NARROW = 12

@njit(parallel=True, cache=True)
def _multiply(words, panels, out):
    """out = A @ B, for A's rows packed in `words` (a multiple of TILE_ROWS rows) and B in
    `panels`; one tile of out per step, the tiles of a panel next to each other so that
    the panel stays in cache."""
    groups = words.shape[0] // TILE_ROWS
    for tile in prange(panels.shape[0] * groups):
        p, g = divmod(np.intp(tile), groups)  # prange's index is unsigned
        i, j = g * TILE_ROWS, p * PANEL
        s00 = s01 = s10 = s11 = s20 = s21 = s30 = s31 = zeros()
        for q in range(words.shape[1]):
            lo, hi = load_byte_pairs(panels, (p, q, 0)), load_byte_pairs(panels, (p, q, 32))
            x = words[i, q]
            s00, s01 = dot_pairs(s00, lo, x), dot_pairs(s01, hi, x)
            x = words[i + 1, q]
            s10, s11 = dot_pairs(s10, lo, x), dot_pairs(s11, hi, x)
            x = words[i + 2, q]
            s20, s21 = dot_pairs(s20, lo, x), dot_pairs(s21, hi, x)
            x = words[i + 3, q]
            s30, s31 = dot_pairs(s30, lo, x), dot_pairs(s31, hi, x)
        store_ints(out, (i, j), s00)
        store_ints(out, (i, j + 16), s01)
        store_ints(out, (i + 1, j), s10)
        store_ints(out, (i + 1, j + 16), s11)
        store_ints(out, (i + 2, j), s20)
        store_ints(out, (i + 2, j + 16), s21)
        store_ints(out, (i + 3, j), s30)
        store_ints(out, (i + 3, j + 16), s31)


@njit(parallel=True, cache=True)
def _multiply_narrow(a, columns, out):
    """out[:len(a)] = A @ B for B's columns given as rows of `columns`, a sum at a time
    (LLVM vectorizes it along k, with pmaddwd)."""
    for i in prange(a.shape[0]):
        for j in range(columns.shape[0]):
            total = np.int32(0)
            for p in range(a.shape[1]):  # int32, not numba's int64: wraps as the result does
                total = np.int32(total + np.int32(a[i, p]) * np.int32(columns[j, p]))
            out[i, j] = total


@njit(parallel=True, cache=True)
def _pack_words(u):
    """Panels of u (K, N) uint8: [panel, k / 2, column] uint16 words, k even in the low
    byte (16-bit stores: byte stores two apart do not vectorize)."""
    k, n = u.shape
    words = np.zeros((-(-n // PANEL), -(-k // 2), PANEL), np.uint16)
    for q in prange(k // 2):
        for p in range(words.shape[0]):
            j0 = p * PANEL
            for c in range(min(PANEL, n - j0)):
                words[p, q, c] = u[2 * q, j0 + c] | (np.uint16(u[2 * q + 1, j0 + c]) << 8)
    if k % 2:
        for j in range(n):
            words[j // PANEL, k // 2, j % PANEL] = u[k - 1, j]
    return words


def pack(b: np.ndarray) -> np.ndarray:
    """B (K, N) uint8 or int8 as zero-padded panels [panel, k / 2, 2 * column + k % 2]."""
    return _pack_words(b.view(np.uint8)).view(b.dtype)


def matmul_blocks(a: np.ndarray, b: np.ndarray, rows: int):
    """(first row, rows first.. of A @ B) for blocks of at most `rows` rows, exactly (int32
    for int8 operands, uint32 for uint8). Each block is a view of one array that the next
    block overwrites: use it at once."""
    assert a.dtype == b.dtype and a.dtype in (np.uint8, np.int8) and a.shape[1] == b.shape[0]
    (m, k), n = a.shape, b.shape[1]
    result = np.int32 if a.dtype == np.int8 else np.uint32
    if n < NARROW:
        columns = np.ascontiguousarray(b.T)
        out = np.empty((min(rows, m), n), result)
        for i0 in range(0, m, rows):
            _multiply_narrow(a[i0: i0 + rows], columns, out)
            yield i0, out[:min(rows, m - i0)]
        return
    panels = pack(b)
    rows = min(-(-rows // TILE_ROWS), -(-m // TILE_ROWS)) * TILE_ROWS
    halves = np.zeros((rows, 2 * panels.shape[1]), np.int16)  # A's rows, a word per pair of k
    out = np.empty((rows, panels.shape[0] * PANEL), result)
    for i0 in range(0, m, rows):
        r = min(rows, m - i0)
        halves[:r, :k] = a[i0: i0 + r]
        _multiply(halves.view(np.int32), panels, out)
        yield i0, out[:r, :n]


def matmul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """A @ B exactly: int32 for int8 operands, uint32 for uint8 ones."""
    (_, block), = matmul_blocks(a, b, max(1, a.shape[0]))
    return block.copy()


@njit(cache=True)
def dot(x, y):
    """Sum of x * y for two uint8 vectors (strided views allowed), exactly (int64)."""
    total = 0
    for i in range(x.shape[0]):
        total += np.int32(x[i]) * np.int32(y[i])
    return total
