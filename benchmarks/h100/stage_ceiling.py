"""What bounds the staged Q4_K matrix-vector product (issue 17): its kernel streamed as
benchmarks/cuda/quantized.py's `streamed` runs products (one CUDA graph over 256 MB of
distinct weights), as built, with its arithmetic stripped (each row's loaded words only
xor-ed together: the memory's ceiling) and with its bulk copies stripped (the barriers
complete at once, the products read whatever shared memory holds: the arithmetic's
ceiling); the type's shape reading global memory ("none") alongside.

    python benchmarks/h100/stage_ceiling.py [SHAPES: 16x4,16x8 (outputs x rows a group)]
"""
import importlib
import sys
from pathlib import Path

import numpy as np

from pxvm.backends import get_backend
from pxvm.kernels.ptx import quant_blocks
from staging import restore_copies, strip_copies

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "cuda"))
from quantized import BUSY, STREAM_BYTES, Timer, product_cases, streamed  # noqa: E402

ops_quantized = importlib.import_module("pxvm.ops.quantized")
cuda_backend = importlib.import_module("pxvm.backends.cuda")
DOT, X_TERMS = quant_blocks.K4.dot_rows, quant_blocks.K4.x_terms
SHAPES = [tuple(map(int, s.split("x"))) for s in
          (sys.argv[1] if len(sys.argv) > 1 else "16x4,16x8").split(",")]


def xor_only(self, k, rows, prep, terms, accs):
    """Every loaded word used, no arithmetic: the loads stay, the products go."""
    out = []
    for loaded, acc in zip(rows, accs):
        words = loaded["qs"] + loaded["head"]
        mixed = words[0]
        for word in words[1:]:
            mixed = k.op("xor.b32", mixed, word)
        out.append(k.op("add.f32", acc, k.op("cvt.rn.f32.u32", mixed)))
    return out


def strip_arithmetic():
    quant_blocks.K4.dot_rows = xor_only
    quant_blocks.K4.x_terms = lambda self, k, xs: (xs, [])


MODES = {"as built": lambda: None,
         "no arithmetic": strip_arithmetic,
         "no copies": strip_copies}
backend = get_backend("cuda")
copy_bw = 2 * BUSY / Timer(backend, 10).copy(BUSY)
print(f"{backend.describe()}; 512 MB copy {copy_bw / 1e9:.0f} GB/s read + written")
print("| W (N x K) | shape | prefetch | kernel | us a product | of the copy |")
print("|---|---|---|---|---|---|")
for name, qtype, n, k, w, x, _ in product_cases(np.random.default_rng(0), ("Q4_K",)):
    if n != 4096:
        continue
    tx = backend.from_numpy(x)
    weights = [backend.from_numpy(w) for _ in range(-(-STREAM_BYTES // w.nbytes))]
    for shape in SHAPES:
        for mode, strip in MODES.items():
            for prefetch in ("stage", "none") if mode != "no copies" else ("stage",):
                strip()
                ops_quantized.MATVEC_SHAPES = {qtype: shape}
                ops_quantized.MATVEC_PREFETCH = prefetch
                cuda_backend._ptx.cache_clear()  # the kernels built again, stripped or not
                backend._kernels.clear()
                try:
                    t, _ = streamed(backend, tx, weights, qtype, k, 5)
                finally:
                    quant_blocks.K4.dot_rows, quant_blocks.K4.x_terms = DOT, X_TERMS
                    restore_copies()
                    ops_quantized.MATVEC_PREFETCH = "auto"
                print(f"| {n} x {k} | {shape[0]} x {shape[1]} | {prefetch} | {mode} | "
                      f"{t * 1e6:.2f} | {w.nbytes / t / copy_bw:.0%} |", flush=True)
