"""A few Q4_K products of a 4096 x 4096 weight in the staged kernel's shape (16 x 4), for
Nsight Compute (benchmarks/h100/stage_profile.sh):

    python3 benchmarks/h100/stage_profile.py [copy|nocopy] [stage|none]

"nocopy" strips the kernel's bulk copies (as stage_ceiling.py does): its arithmetic alone.
"""
import importlib
import sys
from pathlib import Path

import numpy as np

import pxvm
from pxvm.backends import get_backend
from staging import strip_copies

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "llm"))
from gguf_blocks import random_blocks  # noqa: E402

ops_quantized = importlib.import_module("pxvm.ops.quantized")
if len(sys.argv) > 1 and sys.argv[1] == "nocopy":
    strip_copies()
ops_quantized.MATVEC_SHAPES = {12: (16, 4)}
ops_quantized.MATVEC_PREFETCH = sys.argv[2] if len(sys.argv) > 2 else "stage"
backend = get_backend("cuda")
rng = np.random.default_rng(0)
n = k = 4096
tw = backend.from_numpy(random_blocks(n, k, 12, rng, k ** -0.5))
tx = backend.from_numpy(rng.standard_normal((1, k)).astype(np.float32))
for _ in range(4):
    y = pxvm.ops.matmul_quant(tx, tw, qtype=12, k=k)
print(float(y.numpy().sum()))
