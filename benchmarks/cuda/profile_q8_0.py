"""A few Q8_0 products of a 4096 x 4096 weight on the CUDA backend, for Nsight Compute:

    ncu --kernel-name regex:matvec --launch-count 2 --section SpeedOfLight \\
        python3 benchmarks/cuda/profile_q8_0.py
"""

import numpy as np
from gguf import GGMLQuantizationType, quants

import pxvm
from pxvm.backends import get_backend

backend = get_backend("cuda")
rng = np.random.default_rng(0)
w = quants.quantize(rng.standard_normal((4096, 4096)).astype(np.float32),
                    GGMLQuantizationType.Q8_0)
tw = backend.from_numpy(np.ascontiguousarray(w).view(np.uint8).reshape(4096, -1))
tx = backend.from_numpy(rng.standard_normal((1, 4096)).astype(np.float32))
for _ in range(4):
    y = pxvm.ops.matmul_quant(tx, tw, qtype=8, k=4096)
print(float(y.numpy().sum()))
