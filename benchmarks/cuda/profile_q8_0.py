"""A few Q8_0 products of an N x K weight (default 4096 x 4096) on the CUDA backend, for
Nsight Compute:

    ncu --kernel-name regex:matvec --launch-count 2 --section SpeedOfLight \\
        python3 benchmarks/cuda/profile_q8_0.py [N K]
"""

import sys

import numpy as np
from gguf import GGMLQuantizationType, quants

import pxvm
from pxvm.backends import get_backend

backend = get_backend("cuda")
rng = np.random.default_rng(0)
n, k = (int(v) for v in sys.argv[1:3]) if len(sys.argv) > 2 else (4096, 4096)
w = quants.quantize(rng.standard_normal((n, k)).astype(np.float32), GGMLQuantizationType.Q8_0)
tw = backend.from_numpy(np.ascontiguousarray(w).view(np.uint8).reshape(n, -1))
tx = backend.from_numpy(rng.standard_normal((1, k)).astype(np.float32))
for _ in range(4):
    y = pxvm.ops.matmul_quant(tx, tw, qtype=8, k=k)
print(float(y.numpy().sum()))
