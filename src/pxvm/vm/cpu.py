"""The CPU executor: runs a validated pxVM program on a numpy copy of the image.

Vectors and matrix elements are read and written a block at a time through views of the
image (one channel plane, or the pixels as u32 words), never through index arrays, so
the executor's temporaries stay a few MB whatever the image (and a byte or two per
element of a matrix product's operands), and its running time follows the element counts
of the work budget (protocol.py).
"""

from __future__ import annotations

import sys
import time

import numpy as np

from ..backends.cpu import kernel as cpu_kernel
from .protocol import (OP_ADD, OP_ARGMAX_I32, OP_BIAS_I32, OP_DOT_RGB, OP_MATMUL,
                       OP_MATMUL_I8, OP_RELU, OP_RELU_I8, OP_REQUANT, Matrix, Program,
                       validate_program)

#: Elements (or vector pixels) one step of an instruction handles; bounds the temporaries
#: and keeps them in the CPU's cache.
CHUNK = 1 << 16
#: Elements of the blocks of A, B and C a matrix product works on at once.
MATMUL_BLOCK = 1 << 20
#: Longest sum of 8-bit products that float32 holds exactly (255 * 255 * 256 < 2^24).
EXACT_K = 256


#: Exact integer products run in float32 BLAS blocks or in pxvm.backends.cpu.kernels.integer
#: (numba; faster: benchmarks/cpu/pxvm_executor.py). numba and its cached kernels are
#: slow to load into a new process, which one program's products never win back: a process
#: loads them once its products have spent INTEGER_KERNELS_AFTER_SECONDS in BLAS (a
#: server, a benchmark), or finds them loaded (the CPU backend); then every product and
#: dot of at least INTEGER_KERNELS_MIN_WORK multiply-adds uses them.
INTEGER_KERNELS_AFTER_SECONDS = 1.0
INTEGER_KERNELS_MIN_WORK = 1 << 12
_blas_seconds = 0.0  # spent in _blas_blocks by this process


def _integer_kernel(entry: str, work: int):
    """Kernel `entry` of pxvm.backends.cpu.kernels.integer for `work` multiply-adds, or None where
    BLAS should do it (see INTEGER_KERNELS_AFTER_SECONDS) or numba is missing."""
    if work < INTEGER_KERNELS_MIN_WORK or (
            "pxvm.backends.cpu.kernels.integer" not in sys.modules
            and _blas_seconds < INTEGER_KERNELS_AFTER_SECONDS):
        return None
    try:
        return cpu_kernel("integer", entry)
    except ImportError:
        return None


def _plane(img: np.ndarray, channel: int, dtype=np.uint8) -> np.ndarray:
    """(H, W) view of one channel of the image."""
    return img.view(dtype)[:, :, channel]


def _words(img: np.ndarray) -> np.ndarray:
    """(H, W) view of the pixels as little-endian u32 words (R is the lowest byte)."""
    return img.view("<u4")[:, :, 0]


def _get(plane: np.ndarray, m: Matrix, start: int = 0, stop: int | None = None) -> np.ndarray:
    """A new 1-D array of elements start..stop of `m` (row-major) from `plane`."""
    stop = m.size if stop is None else stop
    stride = plane.shape[1] - 1
    first, skip = divmod(start, stride)
    last = -(-stop // stride)
    return plane[m.row + first: m.row + last, 1:].flatten()[skip: skip + stop - start]


def _put(plane: np.ndarray, m: Matrix, start: int, values: np.ndarray) -> None:
    """Write `values` as elements start.. of `m` into `plane`."""
    stride = plane.shape[1] - 1
    y, x = divmod(start, stride)
    y, x = m.row + y, x + 1
    done, n = 0, len(values)
    if x > 1:  # finish a partly written image row
        done = min(n, stride + 1 - x)
        plane[y, x: x + done] = values[:done]
        y += 1
    full = (n - done) // stride
    if full:
        plane[y: y + full, 1:] = values[done: done + full * stride].reshape(full, stride)
        done += full * stride
        y += full
    if done < n:
        plane[y, 1: 1 + n - done] = values[done:]


def _regions(plane: np.ndarray, m: Matrix) -> list[np.ndarray]:
    """Views of `plane` holding exactly the elements of `m`: its whole image rows, and the
    part of its last row."""
    full, rest = divmod(m.size, plane.shape[1] - 1)
    views = [plane[m.row: m.row + full, 1:]] if full else []
    if rest:
        views.append(plane[m.row + full, 1: 1 + rest])
    return views


def _row_blocks(m: Matrix):
    """(first element, stop) of blocks of whole matrix rows, about CHUNK elements each."""
    step = max(1, CHUNK // m.cols) * m.cols
    for start in range(0, m.size, step):
        yield start, min(m.size, start + step)


def vector_length(img: np.ndarray, row_a: int, row_b: int) -> int:
    """v1.0 rule: the first column where both rows' pixels are (0, 0, 0, 0), else the width."""
    words = _words(img)
    width = img.shape[1]
    for x0 in range(0, width, CHUNK):
        both_zero = (words[row_a, x0: x0 + CHUNK] | words[row_b, x0: x0 + CHUNK]) == 0
        first = int(np.argmax(both_zero))
        if both_zero[first]:
            return x0 + first
    return width


def _dot(img, ra, rb, n) -> int:
    red = _plane(img, 0)
    if (dot := _integer_kernel("dot", n)) is not None:
        return dot(red[ra, :n], red[rb, :n]) & 0xFFFFFFFF
    total = 0
    for x0 in range(0, n, CHUNK):
        x1 = min(n, x0 + CHUNK)
        products = red[ra, x0:x1].astype(np.uint16) * red[rb, x0:x1]  # 255 * 255 fits u16
        total += int(products.sum(dtype=np.uint64))
    return total & 0xFFFFFFFF


def _add(img, ra, rb, ro, n) -> None:
    red = _plane(img, 0)
    for x0 in range(0, n, CHUNK):
        x1 = min(n, x0 + CHUNK)
        total = np.add(red[ra, x0:x1], red[rb, x0:x1], dtype=np.uint16)
        red[ro, x0:x1] = np.minimum(total, 255, out=total)


def _matmul_blocks(img, a: Matrix, b: Matrix, signed: bool):
    """(first row, block of C's rows) of A @ B, exactly, a few rows at a time: int32 or
    uint32 from the integer kernels, else float32 or float64 from BLAS. Blocks of A hold at
    most MATMUL_BLOCK elements, blocks of C about CHUNK; the caller uses each at once."""
    dtype = np.int8 if signed else np.uint8
    red = _plane(img, 0, dtype)
    a8 = _get(red, a).reshape(a.rows, a.cols)
    b8 = _get(red, b).reshape(b.rows, b.cols)
    kernel = _integer_kernel("matmul_blocks", a.rows * a.cols * b.cols)
    if kernel is not None:
        return kernel(a8, b8, max(1, min(CHUNK // b.cols, MATMUL_BLOCK // a.cols)))
    return _blas_blocks(a8, b8)


def _blas_blocks(a8: np.ndarray, b8: np.ndarray):
    """_matmul_blocks through float32 BLAS, exactly: each float32 product of two 8-bit
    values is an integer below 2^16 and each sum over at most EXACT_K of them stays below
    float32's 2^24, so every block product is exact; longer sums add those up in float64,
    where every sum (below 2^32) is exact too. Blocks of B hold at most MATMUL_BLOCK
    elements, blocks of C at least 16 rows, so that converting B's blocks again for each
    block of C's rows costs little."""
    global _blas_seconds
    started = time.perf_counter()
    (m, k), n = a8.shape, b8.shape[1]
    depth = max(1, min(EXACT_K, MATMUL_BLOCK // n))
    rows = min(max(16, CHUNK // n), MATMUL_BLOCK // depth)
    whole_b = b8.astype(np.float32) if k * n <= MATMUL_BLOCK else None
    # the blocks of C are computed into the same two arrays: the caller uses each at once
    part = np.empty((min(rows, m), n), np.float32)
    acc = np.empty(part.shape) if k > depth else None
    for i0 in range(0, m, rows):
        r = min(rows, m - i0)
        for k0 in range(0, k, depth):
            a_block = a8[i0: i0 + r, k0: k0 + depth].astype(np.float32)
            b_block = (whole_b[k0: k0 + depth] if whole_b is not None
                       else b8[k0: k0 + depth].astype(np.float32))
            np.matmul(a_block, b_block, out=part[:r])
            if acc is not None:
                if k0 == 0:
                    acc[:r] = part[:r]
                else:
                    acc[:r] += part[:r]
        _blas_seconds += time.perf_counter() - started
        yield i0, (part if acc is None else acc)[:r]
        started = time.perf_counter()


def _write_header(img, m: Matrix) -> None:
    img[m.row, 0] = (m.cols & 255, m.cols >> 8, m.rows & 255, m.rows >> 8)


def requantize(acc: np.ndarray, mult: int, shift: int, zero_point: int,
               value: np.ndarray | None = None, out: np.ndarray | None = None) -> np.ndarray:
    """sign(acc) * round_half_away(|acc| * mult / 2^shift) + zero_point, saturated to int8,
    as float64 (whole numbers). `value` and `out`, float64 arrays of acc's size, hold the
    work when given, so that no temporary is allocated.

    float64 computes it exactly: |acc| * mult < 2^47, adding 2^(shift-1) keeps it below
    2^48, and scaling by 2^-shift and flooring are exact for such numbers."""
    value = np.empty(acc.shape) if value is None else value
    out = np.empty(acc.shape) if out is None else out
    value[...] = acc
    np.abs(value, out=out)
    out *= mult
    if shift > 0:
        out += 2.0 ** (shift - 1)
        out *= 2.0 ** -shift
        np.floor(out, out=out)
    np.copysign(out, value, out=out)
    out += zero_point
    return np.clip(out, -128, 127, out=out)


def _matmul(img, ins) -> None:
    a, b, c = ins.mats
    signed = ins.opcode == OP_MATMUL_I8
    _write_header(img, c)
    for i0, block in _matmul_blocks(img, a, b, signed):
        if signed:  # |sum| < 2^30: an int32, stored as its two's complement word
            _put(_words(img), c, i0 * c.cols, block.astype(np.int32).view("<u4").reshape(-1))
        else:
            _put(_plane(img, 0), c, i0 * c.cols,
                 np.minimum(block, 255, out=block).astype(np.uint8).reshape(-1))


def _bias(img, ins) -> None:
    c, bias = ins.mats
    words = _words(img)
    row = _get(words, bias)  # u32 addition wraps modulo 2^32, as i32 addition must
    for start, stop in _row_blocks(c):
        block = _get(words, c, start, stop).reshape(-1, c.cols) + row
        _put(words, c, start, block.reshape(-1))


def _requant(img, ins) -> None:
    c, out = ins.mats
    mult, shift, zp = ins.extra
    _write_header(img, out)
    words, red = _words(img), _plane(img, 0)
    value, result = np.empty(min(CHUNK, c.size)), np.empty(min(CHUNK, c.size))
    for start in range(0, c.size, CHUNK):
        stop = min(c.size, start + CHUNK)
        acc = _get(words, c, start, stop).view("<i4")
        q = requantize(acc, mult, shift, zp, value[:len(acc)], result[:len(acc)])
        _put(red, out, start, q.astype(np.int8).view(np.uint8))


def _relu_i8(img, ins) -> None:
    (m,) = ins.mats
    for block in _regions(_plane(img, 0, np.int8), m):
        np.maximum(block, 0, out=block)


def _argmax(img, ins) -> None:
    m, out = ins.mats
    _write_header(img, out)
    words = _words(img)
    for start, stop in _row_blocks(m):
        idx = np.argmax(_get(words, m, start, stop).view("<i4").reshape(-1, m.cols), axis=1)
        first_row = start // m.cols
        _put(_plane(img, 0), out, first_row, (idx & 255).astype(np.uint8))
        _put(_plane(img, 1), out, first_row, (idx >> 8).astype(np.uint8))


def execute(img: np.ndarray, program: Program) -> np.ndarray:
    for ins in program.instructions:
        op = ins.opcode
        if op in (OP_DOT_RGB, OP_ADD):
            ra, rb, ro = ins.rows
            n = vector_length(img, ra, rb)
            if op == OP_ADD:
                _add(img, ra, rb, ro, n)
            else:
                dot = _dot(img, ra, rb, n)
                img[ro, 0, 0], img[ro, 0, 1] = dot & 255, (dot >> 8) & 255
        elif op == OP_RELU:
            pass  # v1.0: unsigned data are never negative
        elif op in (OP_MATMUL, OP_MATMUL_I8):
            _matmul(img, ins)
        elif op == OP_BIAS_I32:
            _bias(img, ins)
        elif op == OP_REQUANT:
            _requant(img, ins)
        elif op == OP_RELU_I8:
            _relu_i8(img, ins)
        elif op == OP_ARGMAX_I32:
            _argmax(img, ins)
    return img


def run_program_cpu(img: np.ndarray) -> np.ndarray:
    """Run a .pxi image on the CPU; returns the mutated copy (H, W, 4) uint8."""
    program = validate_program(img)
    return execute(np.array(img, dtype=np.uint8, copy=True), program)
