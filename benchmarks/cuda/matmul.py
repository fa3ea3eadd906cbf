"""FP32 matrix products on the CUDA backend against cuBLAS (PyTorch, TF32 off) in one run.

    python benchmarks/cuda/matmul.py [--sizes 1024 2048 4096 8192] [--repeats 10]

pxvm's GPU time is the median of --repeats timed batches after a warm-up (events around
the launch); PyTorch's the median of as many runs between CUDA events. Each pxvm result
is checked against PyTorch's product of the same inputs (NMSE).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import numpy as np

import pxvm
from pxvm import get_backend
from pxvm.backends.cuda.ops import matmul as cuda_matmul
from pxvm.core import tuning
from pxvm.tools.bench_ops import TorchPeer

SHAPES = [(4096, 11008, 4096), (512, 576, 1536), (512, 1536, 576)]  # LLM projections (M, K, N)


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="*", default=[1024, 2048, 4096, 8192])
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--shape", default=None,
                        help="the tensor-core kernel's shape: mma.sync's BLOCK_NxWARP_NxSTAGES "
                             "(e.g. 128x64x2), wgmma's BLOCK_NxSTAGESxIN_FLIGHT (128x4x0)")
    parser.add_argument("--tc-kernel", choices=["auto", "mma", "wgmma"], default="auto",
                        help="the tensor-core kernel (auto: as tuned, else wgmma on sm_90)")
    parser.add_argument("--fp16", action="store_true",
                        help="the tensor-core product of float16 A and B^T (matmul_f16) "
                             "against cuBLAS's FP16 A @ B^T")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = False
    # the choices `pxvm tune` makes, forced for this run
    forced = contextlib.ExitStack()
    if args.tc_kernel != "auto":
        forced.enter_context(tuning.forcing(cuda_matmul.KERNEL_TUNED, args.tc_kernel))
    if args.shape:
        shape = tuple(int(v) for v in args.shape.split("x"))
        name = (cuda_matmul.MMA_SHAPE_TUNED if args.tc_kernel == "mma"
                else cuda_matmul.WGMMA_SHAPE_TUNED)
        forced.enter_context(tuning.forcing(name, shape))
    backend = get_backend("cuda")
    kind = (f"FP16 tensor cores, FP32 accumulation; pxvm's kernel {args.tc_kernel} "
            f"{args.shape or 'default'}" if args.fp16 else "FP32, TF32 off")
    print(f"device: {backend.describe()}; torch {torch.__version__} (cuBLAS, {kind})\n")
    print("| M x K x N | pxvm ms | pxvm TFLOP/s | cuBLAS ms | cuBLAS TFLOP/s | pxvm / cuBLAS | NMSE |")
    print("|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    with forced:
        measure(args, backend, rng, torch)


def measure(args, backend, rng, torch) -> None:
    for m, k, n in [(s, s, s) for s in args.sizes] + SHAPES:
        dtype = np.float16 if args.fp16 else np.float32
        a = rng.standard_normal((m, k), dtype=np.float32).astype(dtype)
        b = rng.standard_normal((n, k) if args.fp16 else (k, n), dtype=np.float32).astype(dtype)
        ta, tb = backend.from_numpy(a), backend.from_numpy(b)
        samples = []
        for i in range(args.repeats + 1):
            with pxvm.Batch(backend, timestamps=True) as batch:
                out = (pxvm.ops.matmul_f16(ta, tb, transpose_b=True) if args.fp16
                       else pxvm.ops.matmul(ta, tb))
            batch.execute()
            if i:
                samples.append(batch.device_seconds)
        t = statistics.median(samples)
        xa, xb = torch.from_numpy(a).cuda(), torch.from_numpy(b).cuda()
        if args.fp16:
            xb = xb.t()  # a transposed view: cuBLAS multiplies by B^T directly
        ref = xa @ xb
        tc = TorchPeer(torch).time(lambda: xa @ xb, args.repeats)
        got = batch.read(out).astype(np.float64)
        expected = (a.astype(np.float64) @ b.astype(np.float64).T if args.fp16
                    else ref.cpu().numpy().astype(np.float64))
        err = float(np.sum((got - expected) ** 2) / np.sum(expected ** 2))
        flops = 2.0 * m * k * n
        print(f"| {m} x {k} x {n} | {t * 1e3:.3f} | {flops / t / 1e12:.1f} | {tc * 1e3:.3f} | "
              f"{flops / tc / 1e12:.1f} | {tc / t:.2f} | {err:.1e} |")


if __name__ == "__main__":
    main()
