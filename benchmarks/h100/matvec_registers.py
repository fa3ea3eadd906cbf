"""The quantized matrix-vector kernel's shape (outputs a block, rows a group) and weight
prefetch (pxvm.kernels.ptx.quantized.PREFETCHES) against a cap on its registers
(`.maxnreg`: pxvm.kernels.ptx.quantized.MATVEC_MAX_REGISTERS), for
Q4_K and Q8_0 at benchmarks/cuda/quantized.py's weight shapes: each product alone after
L2 is emptied (that script's Timer) and back to back over distinct weights in one CUDA
graph (its stream_table's way), in GB/s of the weight and % of the 512 MB copy.
Usage: python matvec_registers.py [--shapes 16x8,8x4] [--caps 0,80,64]
    [--prefetches none,stage] [--types Q4_K,Q8_0]"""
import argparse
import importlib
import sys
from pathlib import Path

import numpy as np

import pxvm
from pxvm.backends import get_backend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
from quantized import (BUSY, STREAM_BYTES, Timer, nmse, product_cases,  # noqa: E402
                       streamed)

ops_quantized = importlib.import_module("pxvm.ops.quantized")
ptx_quantized = importlib.import_module("pxvm.kernels.ptx.quantized")
cuda_backend = importlib.import_module("pxvm.backends.cuda")

parser = argparse.ArgumentParser()
parser.add_argument("--shapes", default="16x8,8x8,8x4,4x4")
parser.add_argument("--caps", default="0")
parser.add_argument("--prefetches", default="none")
parser.add_argument("--types", default="Q4_K,Q8_0")
args = parser.parse_args()
shapes = [tuple(map(int, s.split("x"))) for s in args.shapes.split(",")]
caps = [int(c) or None for c in args.caps.split(",")]
prefetches = args.prefetches.split(",")
types = args.types.split(",")
backend = get_backend("cuda")
timer = Timer(backend, 10)
copy_bw = 2 * BUSY / timer.copy(BUSY)
print(f"{backend.describe()}; 512 MB copy {copy_bw / 1e9:.0f} GB/s read + written")
print("| type | W (N x K) | shape | prefetch | cap | alone us, GB/s, % "
      "| streamed us, GB/s, % | NMSE |")
print("|---|---|---|---|---|---|---|---|")
rng = np.random.default_rng(0)
saved_shapes = ops_quantized.MATVEC_SHAPES
for name, qtype, n, k, w, x, expected in product_cases(rng, types):
    tx = backend.from_numpy(x)
    weights = [backend.from_numpy(w) for _ in range(-(-STREAM_BYTES // w.nbytes))]
    for shape, prefetch, cap in [(s, p, c) for s in shapes for p in prefetches for c in caps]:
        ops_quantized.MATVEC_SHAPES = {qtype: shape}
        ops_quantized.MATVEC_PREFETCH = prefetch
        ptx_quantized.MATVEC_MAX_REGISTERS = cap
        cuda_backend._ptx.cache_clear()  # kernels built again with the cap
        backend._kernels.clear()
        try:
            alone, _ = timer.launches(lambda: pxvm.ops.matmul_quant(
                tx, weights[0], qtype=qtype, k=k))
            stream, got = streamed(backend, tx, weights, qtype, k, 5)
        finally:
            ops_quantized.MATVEC_SHAPES = saved_shapes
            ops_quantized.MATVEC_PREFETCH = "auto"
        cells = [f"{t * 1e6:.1f}, {w.nbytes / t / 1e9:.0f}, {w.nbytes / t / copy_bw:.0%}"
                 for t in (alone, stream)]
        print(f"| {name} | {n} x {k} | {shape[0]} x {shape[1]} | {prefetch} | {cap or '-'} | "
              f"{cells[0]} | {cells[1]} | {nmse(got, expected):.1e} |", flush=True)
