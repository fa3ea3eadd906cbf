"""Element-wise ops and a dot product on WebGPU, each in a timed Batch whose output is
read back: GPU time from the batch's timestamps (which must not include the readback)
and the host's wall time, medians of 5 after a warm-up, at 2^20 and 2^24 elements.
Usage: python benchmarks/webgpu/timed_batches.py"""
import statistics
import time

import numpy as np

import pxvm
from pxvm import get_backend
from pxvm.batch import Batch

backend = get_backend("webgpu")
print(backend.describe())
rng = np.random.default_rng(0)
for n in (1 << 20, 1 << 24):
    a = pxvm.tensor(rng.random(n, np.float32), backend=backend)
    b = pxvm.tensor(rng.random(n, np.float32), backend=backend)
    for name, run, nbytes in (("add", lambda: pxvm.ops.add(a, b), 12 * n),
                              ("relu", lambda: pxvm.ops.relu(a), 8 * n),
                              ("dot", lambda: pxvm.ops.dot(a, b), 8 * n)):
        gpu, wall = [], []
        for _ in range(6):
            t0 = time.perf_counter()
            with Batch(backend, timestamps=True) as batch:
                out = run()
            batch.execute()
            batch.read(out)
            wall.append(time.perf_counter() - t0)
            gpu.append(batch.device_seconds)
        g, w = statistics.median(gpu[1:]), statistics.median(wall[1:])
        print(f"{name} of {n:,} elements: GPU {g * 1e6:.1f} us ({nbytes / g / 1e9:,.0f} GB/s), "
              f"host {w * 1e3:.1f} ms")
