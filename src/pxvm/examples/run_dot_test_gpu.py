"""Seed 001's GPU test: run dot_test.pxi on the GPU and check pixel (0,3) holds 300.

    python -m pxvm.examples.run_dot_test_gpu
"""

from __future__ import annotations

import sys
import time
from importlib import resources

import numpy as np

from pxvm.backends import webgpu_backend
from pxvm.core.errors import PxvmError
from pxvm.vm import load_pxi, run_program_gpu

BAR = "=" * 60


def main() -> int:
    print(BAR)
    print("pxVM GPU EXECUTION TEST")
    print(BAR)
    try:
        backend = webgpu_backend()
    except PxvmError as exc:
        print(f"\nGPU execution not available: {exc}")
        return 1
    print(f"\nGPU: {backend.describe()}")
    path = resources.files("pxvm.examples").joinpath("dot_test.pxi")
    img = load_pxi(path.read_bytes())
    print(f"Loading: {path.name}")
    print(f"Image size: {img.shape[1]}x{img.shape[0]} RGBA")
    print("\nExecuting on GPU...")
    run_program_gpu(img, backend)  # compile the interpreter before timing
    t0 = time.perf_counter()
    out = run_program_gpu(img, backend)
    dt = time.perf_counter() - t0
    value = int(out[3, 0, 0]) + 256 * int(out[3, 0, 1])
    print(f"Executed in {dt * 1e3:.2f} ms (upload, one submit, readback)")
    print(f"\n{BAR}\nRESULT\n{BAR}")
    print(f"Dot product read from pixel (0,3): {value}")
    print(f"Encoded as bytes: R={out[3, 0, 0]}, G={out[3, 0, 1]}")
    ok = value == int(np.dot([1, 2, 3, 4], [10, 20, 30, 40]))
    print(f"\n{'CORRECT' if ok else 'WRONG'} (expected 300)\n{BAR}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
