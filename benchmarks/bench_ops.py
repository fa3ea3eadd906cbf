"""Benchmark: pxvm's GPU matmul and dot product against numpy, measured in one run.

    python benchmarks/bench_ops.py                 # matmul 1024/2048/4096, dot 1e6/1e7
    python benchmarks/bench_ops.py --quick         # small sizes, for a smoke test

GPU kernel time comes from timestamp queries around the kernels (inputs already on the
device); "GPU end-to-end" adds upload, submit and readback as a user of
`pxvm.ops.matmul(numpy, numpy).numpy()` sees it. Every figure is the median of
`--repeats` runs after a warm-up. Prints a markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import numpy as np

import pxvm
from pxvm.backends import gpu_backend


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up: pipeline compilation, pool fill
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gpu_kernel_time(record, repeats: int) -> float | None:
    """Median GPU time of the work `record(batch)` queues, from timestamp queries."""
    samples = []
    for i in range(repeats + 1):
        batch = pxvm.Batch("gpu", timestamps=True)
        record(batch)
        batch.execute()
        batch.backend.device.wait()
        if i and batch.gpu_seconds is not None:
            samples.append(batch.gpu_seconds)
    return statistics.median(samples) if samples else None


def bench_matmul(n: int, repeats: int, rng) -> dict:
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    ta, tb = pxvm.tensor(a, backend="gpu"), pxvm.tensor(b, backend="gpu")
    flops = 2.0 * n**3
    t_np = median_time(lambda: a @ b, repeats)
    t_kernel = gpu_kernel_time(lambda batch: batch.matmul(ta, tb), repeats)
    t_e2e = median_time(lambda: pxvm.ops.matmul(a, b, backend="gpu").numpy(), repeats)
    got = pxvm.ops.matmul(ta, tb).numpy()
    ref = a.astype(np.float64) @ b
    nmse = float(np.sum((got - ref) ** 2) / np.sum(ref**2))
    return {"op": f"matmul {n}x{n}x{n}", "numpy": t_np, "kernel": t_kernel, "e2e": t_e2e,
            "rate": lambda t: f"{flops / t / 1e12:.2f} TFLOP/s", "nmse": nmse}


def bench_dot(n: int, repeats: int, rng) -> dict:
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    ta, tb = pxvm.tensor(a, backend="gpu"), pxvm.tensor(b, backend="gpu")
    nbytes = 8.0 * n
    t_np = median_time(lambda: np.dot(a, b), repeats)
    t_kernel = gpu_kernel_time(lambda batch: batch.dot(ta, tb), repeats)
    t_e2e = median_time(lambda: pxvm.ops.dot(a, b, backend="gpu").numpy(), repeats)
    got = float(pxvm.ops.dot(ta, tb).numpy())
    ref = float(np.dot(a.astype(np.float64), b))
    return {"op": f"dot {n:.0e}".replace("+0", ""), "numpy": t_np, "kernel": t_kernel,
            "e2e": t_e2e, "rate": lambda t: f"{nbytes / t / 1e9:.0f} GB/s",
            "nmse": (got - ref) ** 2 / ref**2}


def fmt_ms(t):
    return "n/a" if t is None else f"{t * 1e3:.3f} ms"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--matmul", type=int, nargs="*", default=[1024, 2048, 4096])
    parser.add_argument("--dot", type=float, nargs="*", default=[1e6, 1e7])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--quick", action="store_true", help="small sizes, 3 repeats")
    args = parser.parse_args(argv)
    if args.quick:
        args.matmul, args.dot, args.repeats = [128, 256], [1e5], 3
    backend = gpu_backend()
    import wgpu

    print(f"device: {backend.describe()}")
    print(f"pxvm {pxvm.__version__}, wgpu {wgpu.__version__}, numpy {np.__version__}, "
          f"Python {platform.python_version()}, CPU threads: numpy's default")
    rng = np.random.default_rng(0)
    rows = [bench_matmul(n, args.repeats, rng) for n in args.matmul]
    rows += [bench_dot(int(n), args.repeats, rng) for n in args.dot]
    print()
    print("| op | numpy | pxvm GPU kernel | pxvm GPU end-to-end | kernel speed-up vs numpy | NMSE |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        speedup = "n/a" if r["kernel"] is None else f"{r['numpy'] / r['kernel']:.1f}x"
        kernel = fmt_ms(r["kernel"]) + ("" if r["kernel"] is None else f" ({r['rate'](r['kernel'])})")
        print(f"| {r['op']} | {fmt_ms(r['numpy'])} ({r['rate'](r['numpy'])}) | {kernel} | "
              f"{fmt_ms(r['e2e'])} | {speedup} | {r['nmse']:.1e} |")


if __name__ == "__main__":
    main()
