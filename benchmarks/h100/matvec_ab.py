"""Quantized matrix-vector products streamed (benchmarks/cuda/quantized.py's `streamed`:
one CUDA graph over 256 MB of distinct weights, dependent launches) under variants of
module constants, alternating in one process, the kernels built again for each:
`name:module.CONST=value,..` (variants.py), modules the keys of MODULES.

    python matvec_ab.py [--types Q4_K,Q8_0] [--rounds 2] [--repeats 5] VARIANT [VARIANT ..]

e.g. `base late:ptx_quantized.STAGED_LATE_GROUPS=1`. Prints each product's time and its
share of the 512 MB device-to-device copy measured before each round, and the kernel the
op chose.
"""
import argparse
import importlib
import sys
from pathlib import Path

import numpy as np

import pxvm
from pxvm.backends import get_backend
from variants import Variants

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
from quantized import (BUSY, STREAM_BYTES, Timer, kernels_of, nmse, product_cases,  # noqa: E402
                       streamed)

MODULES = {"ptx_quantized": "pxvm.kernels.ptx.quantized", "quantized": "pxvm.ops.quantized"}
cuda_backend = importlib.import_module("pxvm.backends.cuda")
parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--types", default="Q4_K,Q8_0")
parser.add_argument("--rounds", type=int, default=2)
parser.add_argument("--repeats", type=int, default=5)
parser.add_argument("variants", nargs="+")
args = parser.parse_args()
backend = get_backend("cuda")
variants = Variants(MODULES)
cases = list(product_cases(np.random.default_rng(0), args.types.split(",")))
print(f"{backend.describe()}; streamed, median of {args.repeats} submits a product")
print("| round | variant | type | W (N x K) | kernel | us a product | of the copy | NMSE |")
print("|---|---|---|---|---|---|---|---|")
for round_ in range(args.rounds):
    copy_bw = 2 * BUSY / Timer(backend, 10).copy(BUSY)
    for spec in args.variants:
        name = variants.apply(spec)
        cuda_backend._ptx.cache_clear()
        backend._kernels.clear()
        for type_name, qtype, n, k, w, x, expected in cases:
            tx = backend.from_numpy(x)
            weights = [backend.from_numpy(w) for _ in range(-(-STREAM_BYTES // w.nbytes))]
            kernel = kernels_of(backend, lambda: pxvm.ops.matmul_quant(
                tx, weights[0], qtype=qtype, k=k))
            t, got = streamed(backend, tx, weights, qtype, k, args.repeats)
            print(f"| {round_ + 1} | {name} | {type_name} | {n} x {k} | {kernel} | "
                  f"{t * 1e6:.2f} | {w.nbytes / t / copy_bw:.1%} | {nmse(got, expected):.0e} |",
                  flush=True)
variants.apply("")
