"""The browser page's test data: the conformance cases (every op's, pxvm.ops.cases, which
the page runs through the WebGPU kernels in the browser), the in-browser benchmarks'
inputs, and random pxVM programs. plans.py turns a case into a dispatch plan with the
expected output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..ops.cases import CASES
from ..vm.assembler import assemble


@dataclass(frozen=True)
class PageBenchmark:
    """Inputs from `make(rng)` and the work of one run: `flops(inputs)` and
    `bytes_moved(inputs)`."""

    make: Callable[[np.random.Generator], list]
    flops: Callable[[list], float]
    bytes_moved: Callable[[list], float]
    params: dict = field(default_factory=dict)


def _normal(*shape, scale=3.0):
    return lambda rng: [(rng.standard_normal(shape) * scale).astype(np.float32)]


#: Larger inputs for the in-browser benchmark, by op.
BENCHMARKS: dict[str, PageBenchmark] = {
    "add": PageBenchmark(
        lambda rng: [rng.standard_normal(1 << 18).astype(np.float32) for _ in range(2)],
        flops=lambda xs: xs[0].size, bytes_moved=lambda xs: 12.0 * xs[0].size),
    "gelu": PageBenchmark(_normal(1 << 18), flops=lambda xs: 20.0 * xs[0].size,
                          bytes_moved=lambda xs: 8.0 * xs[0].size),
    "softmax": PageBenchmark(_normal(256, 1024), flops=lambda xs: 5.0 * xs[0].size,
                             bytes_moved=lambda xs: 8.0 * xs[0].size),
    "sum": PageBenchmark(_normal(1 << 18), flops=lambda xs: xs[0].size,
                         bytes_moved=lambda xs: 4.0 * xs[0].size),
    "matmul": PageBenchmark(
        lambda rng: [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2)],
        flops=lambda xs: 2.0 * xs[0].shape[0] * xs[0].shape[1] * xs[1].shape[1],
        bytes_moved=lambda xs: 4.0 * (xs[0].size + xs[1].size + xs[0].shape[0] * xs[1].shape[1])),
}

__all__ = ["BENCHMARKS", "CASES", "PageBenchmark", "random_program"]


def random_program(seed: int) -> np.ndarray:
    """A random valid pxVM program exercising every executable opcode: noise everywhere
    but in the instruction row, dot products and adds over random rows, and an int8
    matmul -> bias -> requantize -> relu -> argmax chain on random matrices."""
    rng = np.random.default_rng(seed)
    w = int(rng.integers(24, 40))
    m, k, n = (int(v) for v in rng.integers(2, 7, 3))

    def vals(count, lo, hi):
        return " ".join(str(int(v)) for v in rng.integers(lo, hi, count))

    # rows 1..8 vectors; matrices from row 10 on, each in its own block of rows
    rows_needed = lambda size: -(-size // (w - 1))  # noqa: E731
    a_row = 10
    b_row = a_row + rows_needed(m * k)
    c_row = b_row + rows_needed(k * n)
    bias_row = c_row + rows_needed(m * n)
    q_row = bias_row + rows_needed(n)
    out_row = q_row + 1
    arg_row = out_row + rows_needed(m * n)
    height = arg_row + rows_needed(m) + 2
    lines = [f".size {w} {height}"]
    for _ in range(int(rng.integers(2, 5))):
        ra, rb, ro = rng.integers(1, 9, 3)
        lines.append(f"{rng.choice(['DOT_RGB', 'ADD'])} {ra} {rb} {ro}")
    lines += [f"MATMUL_I8 {a_row} {b_row} {c_row}", f"BIAS_I32 {c_row} {bias_row}",
              f"REQUANT {c_row} {q_row} {out_row}", f"RELU_I8 {out_row}",
              f"MATMUL_I8 {a_row} {b_row} {c_row}", f"ARGMAX_I32 {c_row} {arg_row}", "HALT"]
    for y in range(1, 9):
        lines.append(f".vector {y} {vals(w, 0, 256)}")
    lines.append(f".matrix {a_row} {m} {k} {vals(m * k, -128, 128)}")
    lines.append(f".matrix {b_row} {k} {n} {vals(k * n, -128, 128)}")
    lines.append(f".matrix32 {c_row} {m} {n} {vals(m * n, 0, 1)}")
    lines.append(f".matrix32 {bias_row} 1 {n} {vals(n, -5000, 5000)}")
    lines.append(f".requant {q_row} {int(rng.integers(1, 1 << 15))} {int(rng.integers(8, 20))} "
                 f"{int(rng.integers(-20, 20))}")
    img = assemble("\n".join(lines))
    # random G/B/A noise in the vector rows: the executors must leave or use it identically
    img[1:9, :, 1:] = rng.integers(0, 256, (8, w, 3), dtype=np.uint8)
    return img
