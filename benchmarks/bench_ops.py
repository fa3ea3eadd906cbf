"""Benchmark: pxvm's GPU matmul and dot product against numpy, measured in one run.

    python benchmarks/bench_ops.py                 # matmul 1024/2048/4096, dot 1e6/1e7
    python benchmarks/bench_ops.py --quick         # small sizes, for a smoke test
    python benchmarks/bench_ops.py --sizes 4096 --kernel tiled_wide --dot-sizes
    python benchmarks/bench_ops.py --sizes --dot-sizes --attention 1024 4096   # decoding

GPU kernel time comes from timestamp queries around the kernels (inputs already on the
device); "GPU end-to-end" adds upload, submit and readback as a user of
`pxvm.ops.matmul(numpy, numpy).numpy()` sees it. Every figure is the median of
`--repeats` runs after a warm-up. Prints a markdown table for BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import importlib
import platform
import statistics
import time

import numpy as np

import pxvm
from pxvm.backends import webgpu_backend
from pxvm.ops.matmul import KERNELS, choose_kernel

# The module, not the op of the same name that pxvm.ops exports.
attention_module = importlib.import_module("pxvm.ops.attention")


def median_time(fn, repeats: int) -> float:
    fn()  # warm-up: pipeline compilation, pool fill
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def gpu_kernel_time(record, repeats: int) -> float | None:
    """Median GPU time of the ops `record()` calls (recorded into a timed batch), from
    timestamp queries."""
    samples = []
    for i in range(repeats + 1):
        with pxvm.Batch("webgpu", timestamps=True) as batch:
            record()
        batch.execute()
        batch.backend.device.wait()
        if i and batch.gpu_seconds is not None:
            samples.append(batch.gpu_seconds)
    return statistics.median(samples) if samples else None


def bench_matmul(n: int, repeats: int, rng, kernel: str = "auto") -> dict:
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    ta, tb = pxvm.tensor(a, backend="webgpu"), pxvm.tensor(b, backend="webgpu")
    flops = 2.0 * n**3
    t_np = median_time(lambda: a @ b, repeats)
    t_kernel = gpu_kernel_time(lambda: pxvm.ops.matmul(ta, tb, kernel=kernel), repeats)
    t_e2e = median_time(lambda: pxvm.ops.matmul(a, b, kernel=kernel, backend="webgpu").numpy(),
                        repeats)
    got = pxvm.ops.matmul(ta, tb, kernel=kernel).numpy()
    ref = a.astype(np.float64) @ b
    nmse = float(np.sum((got - ref) ** 2) / np.sum(ref**2))
    chosen = choose_kernel(n, n, n) if kernel == "auto" else kernel
    return {"op": f"matmul {n}x{n}x{n} ({chosen})", "numpy": t_np, "kernel": t_kernel, "e2e": t_e2e,
            "rate": lambda t: flop_rate(flops / t), "nmse": nmse}


def bench_dot(n: int, repeats: int, rng) -> dict:
    a = rng.standard_normal(n, dtype=np.float32)
    b = rng.standard_normal(n, dtype=np.float32)
    ta, tb = pxvm.tensor(a, backend="webgpu"), pxvm.tensor(b, backend="webgpu")
    nbytes = 8.0 * n
    t_np = median_time(lambda: np.dot(a, b), repeats)
    t_kernel = gpu_kernel_time(lambda: pxvm.ops.dot(ta, tb), repeats)
    t_e2e = median_time(lambda: pxvm.ops.dot(a, b, backend="webgpu").numpy(), repeats)
    got = float(pxvm.ops.dot(ta, tb).numpy())
    ref = float(np.dot(a.astype(np.float64), b))
    return {"op": f"dot {n:.0e}".replace("+0", ""), "numpy": t_np, "kernel": t_kernel,
            "e2e": t_e2e, "rate": lambda t: f"{nbytes / t / 1e9:.3g} GB/s",
            "nmse": (got - ref) ** 2 / ref**2}


def flop_rate(per_second: float) -> str:
    if per_second >= 1e12:
        return f"{per_second / 1e12:.2f} TFLOP/s"
    return f"{per_second / 1e9:.3g} GFLOP/s"


def numpy_decode_attention(q, k, v, scale):
    """float32 numpy attention of Sq queries over all keys (timing peer; for one query
    the causal mask hides nothing)."""
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    qg = q.reshape(sq, hkv, hq // hkv, d)
    scores = np.einsum("ihgd,jhd->hgij", qg, k) * np.float32(scale)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hgij,jhd->ihgd", p, v).reshape(sq, hq, d)


def bench_attention(skv: int, repeats: int, rng, split: bool) -> dict:
    """One decoding step of SmolLM2-135M's attention shape: 1 query, 9 query heads over
    3 key/value heads of 64 dims, `skv` cached keys."""
    sq, hq, hkv, d = 1, 9, 3, 64
    q = rng.standard_normal((sq, hq, d), dtype=np.float32)
    k = rng.standard_normal((skv, hkv, d), dtype=np.float32)
    v = rng.standard_normal((skv, hkv, d), dtype=np.float32)
    tq, tk, tv = (pxvm.tensor(x, backend="webgpu") for x in (q, k, v))
    nbytes = 4.0 * (k.size + v.size)
    saved = attention_module.SPLIT_MAX_TASKS
    attention_module.SPLIT_MAX_TASKS = saved if split else 0
    try:
        n_split = attention_module.split_plan(sq, hq, skv)
        t_np = median_time(lambda: numpy_decode_attention(q, k, v, d**-0.5), repeats)
        t_kernel = gpu_kernel_time(lambda: pxvm.ops.attention(tq, tk, tv), repeats)
        t_e2e = median_time(lambda: pxvm.ops.attention(q, k, v, backend="webgpu").numpy(), repeats)
        got = pxvm.ops.attention(tq, tk, tv).numpy()
    finally:
        attention_module.SPLIT_MAX_TASKS = saved
    ref = pxvm.ops.attention.reference(q, k, v)
    plan = f"{n_split} key ranges" if n_split > 1 else "one pass"
    return {"op": f"attention decode, {skv} keys ({plan})", "numpy": t_np, "kernel": t_kernel,
            "e2e": t_e2e, "rate": lambda t: f"{nbytes / t / 1e9:.3g} GB/s",
            "nmse": float(np.sum((got - ref) ** 2) / np.sum(ref**2))}


def fmt_ms(t):
    return "n/a" if t is None else f"{t * 1e3:.3f} ms"


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", "--matmul", dest="sizes", type=int, nargs="*",
                        help="square matmul sizes (default 1024 2048 4096)")
    parser.add_argument("--dot-sizes", "--dot", dest="dot_sizes", type=float, nargs="*",
                        help="dot product lengths (default 1e6 1e7)")
    parser.add_argument("--attention", type=int, nargs="*", default=[],
                        help="KV cache lengths for a decoding-step attention, timed with "
                             "and without key splitting (default: none)")
    parser.add_argument("--kernel", choices=KERNELS, default="auto", help="matmul kernel")
    parser.add_argument("--repeats", type=int, help="timed runs after the warm-up (default 10)")
    parser.add_argument("--quick", action="store_true",
                        help="defaults for a smoke test: matmul 128 256, dot 1e5, 3 repeats")
    args = parser.parse_args(argv)
    # --quick only changes the defaults: explicit sizes or repeats still win.
    if args.sizes is None:
        args.sizes = [128, 256] if args.quick else [1024, 2048, 4096]
    if args.dot_sizes is None:
        args.dot_sizes = [1e5] if args.quick else [1e6, 1e7]
    if args.repeats is None:
        args.repeats = 3 if args.quick else 10
    backend = webgpu_backend()
    import wgpu

    print(f"device: {backend.describe()}")
    print(f"pxvm {pxvm.__version__}, wgpu {wgpu.__version__}, numpy {np.__version__}, "
          f"Python {platform.python_version()}, CPU threads: numpy's default")
    rng = np.random.default_rng(0)
    rows = [bench_matmul(n, args.repeats, rng, args.kernel) for n in args.sizes]
    rows += [bench_dot(int(n), args.repeats, rng) for n in args.dot_sizes]
    rows += [bench_attention(n, args.repeats, rng, split)
             for n in args.attention for split in (False, True)]
    print()
    print("| op | numpy | pxvm GPU kernel | pxvm GPU end-to-end | kernel speed-up vs numpy | NMSE |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        speedup = "n/a" if r["kernel"] is None else f"{r['numpy'] / r['kernel']:.2g}x"
        kernel = fmt_ms(r["kernel"]) + ("" if r["kernel"] is None else f" ({r['rate'](r['kernel'])})")
        print(f"| {r['op']} | {fmt_ms(r['numpy'])} ({r['rate'](r['numpy'])}) | {kernel} | "
              f"{fmt_ms(r['e2e'])} | {speedup} | {r['nmse']:.1e} |")


if __name__ == "__main__":
    main()
