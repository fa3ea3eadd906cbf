"""Benchmark: the pxVM CPU executor on bench_pxvm.py's n x n x n MATMUL_I8 programs, its
two paths for integer products measured alternately in one process: float32 BLAS blocks
(a one-off program's path) and the numba kernels (a process that has loaded them).

    python benchmarks/cpu/pxvm_executor.py [--sizes 256 512 1024] [--repeats 5]

With PYTHONPATH pointing at another tree's src/, measures that tree's executor as it is
(its one path, where it has no numba kernels). Prints medians after a warm-up and the
output's SHA-256, which must agree across paths and trees.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from bench_pxvm import matmul_program  # noqa: E402

from pxvm.vm import cpu as executor  # noqa: E402


def timed(img, repeats):
    executor.run_program_cpu(img.copy())
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = executor.run_program_cpu(img.copy())
        times.append(time.perf_counter() - t0)
    return float(np.median(times)), hashlib.sha256(out.tobytes()).hexdigest()[:16]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 512, 1024])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    paths = {"BLAS blocks": float("inf")}
    if hasattr(executor, "INTEGER_KERNELS_AFTER_SECONDS"):
        paths["numba kernels"] = 0.0
    print(f"executor: {executor.__file__}")
    print("| n | " + " | ".join(paths) + " | SHA-256 |")
    print("|---|" + "---|" * (len(paths) + 1))
    for n in args.sizes:
        img = matmul_program(n, np.random.default_rng(0))
        cells, digests = [], set()
        for after in paths.values():
            if hasattr(executor, "INTEGER_KERNELS_AFTER_SECONDS"):
                executor.INTEGER_KERNELS_AFTER_SECONDS = after
                if after == float("inf"):
                    sys.modules.pop("pxvm.backends.cpu.kernels.integer", None)  # BLAS again
            seconds, digest = timed(img, args.repeats)
            cells.append(f"{seconds * 1e3:.1f} ms")
            digests.add(digest)
        print(f"| {n} | " + " | ".join(cells) + f" | {', '.join(sorted(digests))} |")


if __name__ == "__main__":
    main()
