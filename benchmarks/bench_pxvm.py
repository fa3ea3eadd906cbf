"""Benchmark: a large MATMUL_I8 pxVM program on the CPU and the GPU executor.

    python benchmarks/bench_pxvm.py [--sizes 64 128 256 512] [--repeats 5]

Each size n runs one program multiplying two n x n int8 matrices (n^3 multiply-adds) with
a bias and an argmax after it. Times are whole executor calls (the GPU one includes
upload, one submit and readback), medians after a warm-up; the images are checked
byte-identical. Prints a markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import numpy as np

from bench_ops import median_time as median  # same warm-up and median rule
from pxvm.backends.webgpu import webgpu_backend
from pxvm.vm import run_program_cpu, run_program_gpu
from pxvm.vm.assembler import assemble
from pxvm.vm.protocol import Matrix

WIDTH = 1024


def matmul_program(n: int, rng) -> np.ndarray:
    rows = Matrix(0, n, n).image_rows(WIDTH) + 1
    a, b, c = 1, 1 + rows, 1 + 2 * rows
    bias = 1 + 3 * rows + Matrix(0, n, n).image_rows(WIDTH)
    out = bias + 2
    vals = lambda: " ".join(map(str, rng.integers(-128, 128, n * n)))  # noqa: E731
    src = "\n".join([
        f".size {WIDTH} {out + 2 + n // WIDTH}",
        f"MATMUL_I8 {a} {b} {c}", f"BIAS_I32 {c} {bias}", f"ARGMAX_I32 {c} {out}", "HALT",
        f".matrix {a} {n} {n} {vals()}", f".matrix {b} {n} {n} {vals()}",
        f".matrix32 {bias} 1 {n} {' '.join(map(str, rng.integers(-1000, 1000, n)))}",
    ])
    return assemble(src)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[32, 64, 128, 256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    backend = webgpu_backend()
    print(f"GPU executor on {backend.describe()}; CPU executor: numpy {np.__version__}")
    rng = np.random.default_rng(0)
    print("\n| n (n x n x n MATMUL_I8) | image | CPU executor | GPU executor | GPU speed-up | identical |")
    print("|---|---|---|---|---|---|")
    for n in args.sizes:
        img = matmul_program(n, rng)
        t_cpu = median(lambda: run_program_cpu(img), args.repeats)
        t_gpu = median(lambda: run_program_gpu(img, backend), args.repeats)
        same = np.array_equal(run_program_cpu(img), run_program_gpu(img, backend))
        print(f"| {n} | {img.shape[1]}x{img.shape[0]} | {t_cpu * 1e3:.2f} ms | "
              f"{t_gpu * 1e3:.2f} ms | {t_cpu / t_gpu:.1f}x | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
