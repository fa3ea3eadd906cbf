"""The CPU executor: runs a validated pxVM program on a numpy copy of the image."""

from __future__ import annotations

import numpy as np

from .protocol import (OP_ADD, OP_ARGMAX_I32, OP_BIAS_I32, OP_DOT_RGB, OP_MATMUL,
                       OP_MATMUL_I8, OP_RELU, OP_RELU_I8, OP_REQUANT, Matrix, Program,
                       element_positions, validate_program)


def vector_length(img: np.ndarray, row_a: int, row_b: int) -> int:
    """v1.0 rule: the first column where both rows' pixels are (0, 0, 0, 0), else the width."""
    both_zero = ~np.any(img[row_a] != 0, axis=1) & ~np.any(img[row_b] != 0, axis=1)
    hits = np.flatnonzero(both_zero)
    return int(hits[0]) if hits.size else img.shape[1]


def _read_u8(img, m: Matrix) -> np.ndarray:
    y, x = element_positions(m, img.shape[1])
    return img[y, x, 0].astype(np.int64).reshape(m.rows, m.cols)


def _read_i8(img, m: Matrix) -> np.ndarray:
    return _read_u8(img, m).astype(np.uint8).view(np.int8).astype(np.int64)


def _read_i32(img, m: Matrix) -> np.ndarray:
    y, x = element_positions(m, img.shape[1])
    return np.ascontiguousarray(img[y, x]).view("<i4").astype(np.int64).reshape(m.rows, m.cols)


def _write_header(img, m: Matrix) -> None:
    img[m.row, 0] = (m.cols & 255, m.cols >> 8, m.rows & 255, m.rows >> 8)


def _write_r(img, m: Matrix, values: np.ndarray) -> None:
    y, x = element_positions(m, img.shape[1])
    img[y, x, 0] = (values.reshape(-1) & 255).astype(np.uint8)


def _write_i32(img, m: Matrix, values: np.ndarray) -> None:
    y, x = element_positions(m, img.shape[1])
    words = (values.reshape(-1) & 0xFFFFFFFF).astype("<u4")
    img[y, x] = words.view(np.uint8).reshape(-1, 4)


def requantize(acc: np.ndarray, mult: int, shift: int, zero_point: int) -> np.ndarray:
    """sign(acc) * round_half_away(|acc| * mult / 2^shift) + zero_point, saturated to int8."""
    mag = np.abs(acc.astype(np.int64)) * mult
    if shift > 0:
        mag = (mag + (1 << (shift - 1))) >> shift
    return np.clip(np.sign(acc) * mag + zero_point, -128, 127)


def execute(img: np.ndarray, program: Program) -> np.ndarray:
    for ins in program.instructions:
        op = ins.opcode
        if op == OP_DOT_RGB:
            ra, rb, ro = ins.rows
            n = vector_length(img, ra, rb)
            dot = int(np.sum(img[ra, :n, 0].astype(np.uint64) * img[rb, :n, 0].astype(np.uint64)))
            dot &= 0xFFFFFFFF
            img[ro, 0, 0], img[ro, 0, 1] = dot & 255, (dot >> 8) & 255
        elif op == OP_ADD:
            ra, rb, ro = ins.rows
            n = vector_length(img, ra, rb)
            total = img[ra, :n, 0].astype(np.int32) + img[rb, :n, 0].astype(np.int32)
            img[ro, :n, 0] = np.minimum(total, 255).astype(np.uint8)
        elif op == OP_RELU:
            pass  # v1.0: unsigned data are never negative
        elif op == OP_MATMUL:
            a, b, c = ins.mats
            prod = _read_u8(img, a) @ _read_u8(img, b)
            _write_header(img, c)
            _write_r(img, c, np.minimum(prod, 255))
        elif op == OP_MATMUL_I8:
            a, b, c = ins.mats
            prod = (_read_i8(img, a) @ _read_i8(img, b)) & 0xFFFFFFFF
            _write_header(img, c)
            _write_i32(img, c, prod)
        elif op == OP_BIAS_I32:
            c, bias = ins.mats
            _write_i32(img, c, _read_i32(img, c) + _read_i32(img, bias).reshape(1, -1))
        elif op == OP_REQUANT:
            c, out = ins.mats
            mult, shift, zp = ins.extra
            _write_header(img, out)
            _write_r(img, out, requantize(_read_i32(img, c), mult, shift, zp))
        elif op == OP_RELU_I8:
            (m,) = ins.mats
            _write_r(img, m, np.maximum(_read_i8(img, m), 0))
        elif op == OP_ARGMAX_I32:
            m, out = ins.mats
            idx = np.argmax(_read_i32(img, m), axis=1)
            _write_header(img, out)
            y, x = element_positions(out, img.shape[1])
            img[y, x, 0], img[y, x, 1] = idx & 255, (idx >> 8) & 255
    return img


def run_program_cpu(img: np.ndarray) -> np.ndarray:
    """Run a .pxi image on the CPU; returns the mutated copy (H, W, 4) uint8."""
    program = validate_program(img)
    return execute(np.array(img, dtype=np.uint8, copy=True), program)
