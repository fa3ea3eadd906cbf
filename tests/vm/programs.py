"""Random valid pxVM programs for property tests: every opcode, chained results, rows
past 255, and random bytes in every channel the executors must leave alone."""

from __future__ import annotations

import numpy as np

from pxvm.vm.protocol import (OP_ADD, OP_ARGMAX_I32, OP_BIAS_I32, OP_DOT_RGB, OP_MATMUL,
                              OP_MATMUL_I8, OP_RELU, OP_RELU_I8, OP_REQUANT, OP_ROWHI, Matrix,
                              element_positions)


class Builder:
    def __init__(self, rng: np.random.Generator, width: int, height: int):
        self.rng = rng
        self.img = rng.integers(0, 256, (height, width, 4), dtype=np.uint8)  # garbage everywhere
        self.img[0] = 0
        self.width, self.height = width, height
        self.next_row = 1 + int(rng.integers(0, 3))
        self.x = 0

    def rows_for(self, rows, cols):
        m = Matrix(self.next_row, rows, cols)
        if self.next_row + m.image_rows(self.width) > self.height:
            return None
        self.next_row += m.image_rows(self.width) + int(self.rng.integers(0, 2))
        return m

    def matrix(self, rows, cols, int32=False):
        m = self.rows_for(rows, cols)
        if m is None:
            return None
        self.img[m.row, 0] = (cols & 255, cols >> 8, rows & 255, rows >> 8)
        if int32:
            ys, xs = element_positions(m, self.width)
            self.img[ys, xs] = self.rng.integers(0, 256, (m.size, 4), dtype=np.uint8)
        return m

    def vector_row(self):
        if self.next_row >= self.height:
            return None
        row = self.next_row
        self.next_row += 1
        return row

    def emit(self, op, *rows, args=None):
        raw = list(args if args is not None else rows) + [0] * 3
        raw = raw[:3]
        if any(r > 255 for r in rows):
            if self.x >= self.width - 2:
                return False
            hi = [(r >> 8) for r in rows] + [0] * (3 - len(rows))
            self.img[0, self.x] = (OP_ROWHI, *hi)
            self.x += 1
            raw = [r & 255 for r in rows] + raw[len(rows):]
        if self.x >= self.width - 1:
            return False
        self.img[0, self.x] = (op, *raw)
        self.x += 1
        return True


def random_program(seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    width = int(rng.integers(8, 80))
    height = int(rng.integers(40, 420))
    b = Builder(rng, width, height)
    int32_results = []
    int8_results = []
    for _ in range(int(rng.integers(1, 12))):
        op = int(rng.choice([OP_DOT_RGB, OP_ADD, OP_RELU, OP_MATMUL, OP_MATMUL_I8, OP_BIAS_I32,
                             OP_REQUANT, OP_RELU_I8, OP_ARGMAX_I32]))
        if op in (OP_DOT_RGB, OP_ADD):
            ra, rb, ro = b.vector_row(), b.vector_row(), b.vector_row()
            if ro is None:
                break
            n = int(rng.integers(0, width + 1))
            if n < width:  # a zero pair ends the vectors
                b.img[ra, n] = 0
                b.img[rb, n] = 0
            ok = b.emit(op, ra, rb, ro)
        elif op == OP_RELU:
            ok = b.emit(op, int(rng.integers(1, height)))
        elif op in (OP_MATMUL, OP_MATMUL_I8):
            m, k, n = (int(v) for v in rng.integers(1, 12, 3))
            if op == OP_MATMUL_I8 and int8_results and rng.random() < 0.5:
                a = int8_results[-1]
                m, k = a.rows, a.cols
            else:
                a = b.matrix(m, k)
            bm, c = b.matrix(k, n), b.rows_for(m, n)
            if a is None or bm is None or c is None:
                break
            ok = b.emit(op, a.row, bm.row, c.row)
            if op == OP_MATMUL_I8:
                int32_results.append(c)
        elif op == OP_BIAS_I32:
            c = int32_results[-1] if int32_results and rng.random() < 0.7 else \
                b.matrix(*(int(v) for v in rng.integers(1, 10, 2)), int32=True)
            bias = b.matrix(1, c.cols, int32=True) if c is not None else None
            if bias is None:
                break
            ok = b.emit(op, c.row, bias.row)
        elif op == OP_REQUANT:
            c = int32_results[-1] if int32_results and rng.random() < 0.7 else \
                b.matrix(*(int(v) for v in rng.integers(1, 10, 2)), int32=True)
            params = b.vector_row() if c is not None else None
            out = b.rows_for(c.rows, c.cols) if params is not None else None
            if out is None:
                break
            mult = int(rng.integers(0, 1 << 16))
            b.img[params, 1] = np.array([mult], "<u4").view(np.uint8)
            b.img[params, 2, 0] = int(rng.integers(0, 32))
            ok = b.emit(op, c.row, params, out.row)
            int8_results.append(out)
        elif op == OP_RELU_I8:
            m = int8_results[-1] if int8_results and rng.random() < 0.7 else \
                b.matrix(*(int(v) for v in rng.integers(1, 10, 2)))
            if m is None:
                break
            ok = b.emit(op, m.row)
        else:  # ARGMAX_I32
            c = int32_results[-1] if int32_results and rng.random() < 0.7 else \
                b.matrix(*(int(v) for v in rng.integers(1, 10, 2)), int32=True)
            out = b.rows_for(c.rows, 1) if c is not None else None
            if out is None:
                break
            ok = b.emit(op, c.row, out.row)
        if not ok:
            break
    b.img[0, b.x:] = 0  # HALT after the last instruction
    if rng.random() < 0.5 and b.x + 1 < width:  # garbage after HALT is never executed
        b.img[0, b.x + 1:] = rng.integers(0, 256, (width - b.x - 1, 4), dtype=np.uint8)
    return b.img
