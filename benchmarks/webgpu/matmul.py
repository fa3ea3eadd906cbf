"""FP32 and FP16-storage matrix products on WebGPU against cuBLAS (PyTorch) in one run.

    python benchmarks/webgpu/matmul.py [--sizes 1024 2048 4096 8192] [--repeats 10]
        [--variants] [--transpose-b] [--no-fp16]

For every product, square sizes then LLM projections (4096 x 11008 x 4096 and prompt
shapes; M x K x N): pxvm's FP32 kernel as the op chooses it and, with --variants,
every tile shape of the register-blocked kernel (pxvm.backends.webgpu.ops.matmul's
BLOCKED_SHAPES); then matmul_f16 (float16 A and B, float32 results) as the op chooses
and, with --variants, the f16-product kernel in each HALF_SHAPES shape (where the adapter
has shader-f16) and the f32-product kernel. Variants are forced as `pxvm tune` forces
its candidates (tuning.forcing). Where torch has CUDA, cuBLAS FP32 (TF32 off) and FP16
(tensor cores) on the same inputs in the same run.

pxvm's time is the GPU time of one batch holding the product (timestamp queries,
`pxvm.Batch(..., timestamps=True)`), the median of --repeats after a warm-up; cuBLAS's the
median of as many runs between CUDA events. Every pxvm result is checked against the
float64 product of the same inputs (NMSE; on the GPU through torch where it can). Ratios:
"/ cuBLAS" is cuBLAS FP32's time over pxvm's (above 1: pxvm faster); "/ pxvm FP32" is
pxvm's FP32 time (the op's choice) over this kernel's.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics

import numpy as np

import pxvm
from pxvm import get_backend
from pxvm.backends.webgpu.ops import matmul as webgpu_matmul
from pxvm.core import tuning
from pxvm.tools.bench_ops import TorchPeer

#: LLM projections (M, K, N): a 7B model's MLP, and prompt shapes of a small model
#: (512 tokens, hidden 576, MLP 1536).
SHAPES = [(4096, 11008, 4096), (4096, 4096, 11008), (512, 576, 1536), (512, 1536, 576)]


def gpu_time(record, repeats: int) -> float:
    """Median GPU seconds of a batch recording `record()` (its result is dropped, so no
    readback is timed), after one warm-up."""
    samples = []
    for i in range(repeats + 1):
        with pxvm.Batch("webgpu", timestamps=True) as batch:
            record()
        batch.execute()
        if i:
            samples.append(batch.device_seconds)
    if any(s is None for s in samples):
        raise SystemExit("this adapter has no timestamp queries: nothing to time")
    return statistics.median(samples)


def result_of(record) -> np.ndarray:
    with pxvm.Batch("webgpu") as batch:
        out = record()
    batch.execute()
    return batch.read(out).astype(np.float64)


def nmse(got: np.ndarray, expected: np.ndarray) -> float:
    return float(np.sum((got - expected) ** 2) / np.sum(expected ** 2))


class Reference:
    """float64 products, and cuBLAS timings where torch has CUDA."""

    def __init__(self, repeats: int):
        self.repeats = repeats
        try:
            import torch
            self.torch = torch if torch.cuda.is_available() else None
        except ImportError:
            self.torch = None
        if self.torch is not None:
            self.torch.backends.cuda.matmul.allow_tf32 = False
            self.torch.backends.cudnn.allow_tf32 = False

    def describe(self) -> str:
        if self.torch is None:
            return "no torch with CUDA: no cuBLAS columns; references by numpy"
        t = self.torch
        return f"torch {t.__version__} on {t.cuda.get_device_name()} (cuBLAS; TF32 off)"

    def product(self, a: np.ndarray, b: np.ndarray, transpose_b: bool) -> np.ndarray:
        if self.torch is None:
            a64, b64 = a.astype(np.float64), b.astype(np.float64)
            return a64 @ (b64.T if transpose_b else b64)
        t = self.torch
        xa = t.from_numpy(a).cuda().double()
        xb = t.from_numpy(b).cuda().double()
        return (xa @ (xb.t() if transpose_b else xb)).cpu().numpy()

    def cublas_time(self, a: np.ndarray, b: np.ndarray, transpose_b: bool) -> float | None:
        if self.torch is None:
            return None
        t = self.torch
        xa, xb = t.from_numpy(a).cuda(), t.from_numpy(b).cuda()
        if transpose_b:
            xb = xb.t()  # a transposed view: cuBLAS multiplies by B^T directly
        return TorchPeer(t).time(lambda: xa @ xb, self.repeats)


def forcing(values: dict):
    """Every tunable of `values` (name -> candidate) forced within the block."""
    stack = contextlib.ExitStack()
    for name, value in values.items():
        stack.enter_context(tuning.forcing(name, value))
    return stack


def measured(record, forced: dict, repeats: int, expected: np.ndarray) -> tuple[float, float]:
    """(GPU seconds, NMSE against `expected`) of `record()` with `forced` in force."""
    with forcing(forced):
        return gpu_time(record, repeats), nmse(result_of(record), expected)


def fp32_runs(variants: bool) -> list[tuple[str, dict]]:
    """(label, forced tunables) of each FP32 run; the first is the op's own choice."""
    runs = [("auto", {})]
    if variants:
        runs += [(f"blocked_{name}", {webgpu_matmul.SHAPE_TUNED: name})
                 for name in webgpu_matmul.BLOCKED_SHAPES]
    return runs


def f16_runs(variants: bool, has_f16: bool) -> list[tuple[str, dict]]:
    """(label, forced tunables) of each FP16-storage run; the first is the op's choice."""
    runs = [("auto", {})]
    if variants:
        for name in webgpu_matmul.HALF_SHAPES if has_f16 else ():
            runs.append((f"half_{name}_sum{webgpu_matmul.HALF_STEPS}",
                         {webgpu_matmul.F16_KERNEL_TUNED: "half",
                          webgpu_matmul.F16_SHAPE_TUNED: name}))
        runs.append(("blocked (f32 products)", {webgpu_matmul.F16_KERNEL_TUNED: "blocked"}))
    return runs


def fmt_ratio(mine: float | None, theirs: float | None) -> str:
    return "-" if mine is None or theirs is None else f"{theirs / mine:.2f}"


class Problem:
    """One M x K x N product: its inputs, reference and table rows."""

    def __init__(self, m: int, k: int, n: int, transpose_b: bool, ref: Reference, rng):
        self.m, self.k, self.n, self.transpose_b, self.ref = m, k, n, transpose_b, ref
        self.flops = 2.0 * m * k * n
        self.label = f"{m} x {k} x {n}"
        self.a = rng.standard_normal((m, k), dtype=np.float32)
        self.b = rng.standard_normal((n, k) if transpose_b else (k, n), dtype=np.float32)
        self.cublas32 = ref.cublas_time(self.a, self.b, transpose_b)
        self.pxvm32: float | None = None  # pxvm's FP32 time, the op's choice
        if self.cublas32 is not None:
            self.print_row("cuBLAS FP32", "torch.matmul", self.cublas32)

    def print_row(self, kind: str, kernel: str, t: float, error: float | None = None) -> None:
        rate = self.flops / t / 1e12
        err = "-" if error is None else f"{error:.1e}"
        print(f"| {self.label} | {kind} | {kernel} | {t * 1e3:.3f} | {rate:.1f} | "
              f"{fmt_ratio(t, self.cublas32)} | {fmt_ratio(t, self.pxvm32)} | {err} |",
              flush=True)

    def fp32(self, backend, runs: list[tuple[str, dict]], repeats: int) -> None:
        expected = self.ref.product(self.a, self.b, self.transpose_b)
        ta, tb = backend.from_numpy(self.a), backend.from_numpy(self.b)
        record = functools.partial(pxvm.ops.matmul, ta, tb, transpose_b=self.transpose_b)
        for name, forced in runs:
            t, error = measured(record, forced, repeats, expected)
            if name == "auto":
                self.pxvm32 = t
                chosen = webgpu_matmul.choose_kernel(self.m, self.n)
                if chosen == "blocked":
                    shape = (tuning.choice(backend, webgpu_matmul.SHAPE_TUNED)
                             or webgpu_matmul.choose_shape(self.m, self.n))
                    chosen = f"blocked_{shape}"
                name = f"auto: {chosen}"
            self.print_row("pxvm FP32", name, t, error)

    def fp16(self, backend, runs: list[tuple[str, dict]], has_f16: bool, repeats: int) -> None:
        a16, b16 = self.a.astype(np.float16), self.b.astype(np.float16)
        cublas16 = self.ref.cublas_time(a16, b16, self.transpose_b)
        if cublas16 is not None:
            self.print_row("cuBLAS FP16", "torch.matmul (tensor cores)", cublas16)
        expected = self.ref.product(a16, b16, self.transpose_b)
        ta, tb = backend.from_numpy(a16), backend.from_numpy(b16)
        record = functools.partial(pxvm.ops.matmul_f16, ta, tb, transpose_b=self.transpose_b)
        for name, forced in runs:
            t, error = measured(record, forced, repeats, expected)
            if name == "auto":
                chosen = webgpu_matmul.choose_f16_kernel(
                    self.m, self.n, has_f16,
                    tuning.choice(backend, webgpu_matmul.F16_KERNEL_TUNED))
                name = f"auto: {chosen}"
            self.print_row("pxvm FP16 storage", name, t, error)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--shapes", action=argparse.BooleanOptionalAction, default=True,
                        help="also the LLM projection shapes (default on)")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--variants", action="store_true",
                        help="every tile shape of the blocked kernels, not only 'auto'")
    parser.add_argument("--transpose-b", action="store_true", help="B as (N, K)")
    parser.add_argument("--no-fp16", action="store_true", help="FP32 only")
    parser.add_argument("--no-fp32", action="store_true", help="FP16 storage only")
    args = parser.parse_args()

    backend = get_backend("webgpu")
    device = backend.device
    has_f16 = device.has("shader-f16")
    ref = Reference(args.repeats)
    layout = "A @ B^T (B is N x K)" if args.transpose_b else "A @ B (B is K x N)"
    print(f"pxvm: {backend.describe()}; features: {', '.join(sorted(device.features))}")
    print(f"reference: {ref.describe()}; {layout}; median of {args.repeats}\n")
    print("| M x K x N | kind | kernel | ms | TFLOP/s | / cuBLAS FP32 | / pxvm FP32 | NMSE |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    problems = [(s, s, s) for s in args.sizes] + (SHAPES if args.shapes else [])
    for m, k, n in problems:
        problem = Problem(m, k, n, args.transpose_b, ref, rng)
        if not args.no_fp32:
            problem.fp32(backend, fp32_runs(args.variants), args.repeats)
        if not args.no_fp16:
            problem.fp16(backend, f16_runs(args.variants, has_f16), has_f16, args.repeats)


if __name__ == "__main__":
    main()
