"""Seed 001's key proof: run the same .pxi on the CPU and the GPU executor and compare.

    python -m pxvm.examples.compare_cpu_gpu [program.pxi]
"""

from __future__ import annotations

import sys
import time
from importlib import resources

import numpy as np

from pxvm.backends import webgpu_backend
from pxvm.core.errors import PxvmError
from pxvm.vm import load_pxi, run_program_cpu, run_program_gpu

BAR = "=" * 60


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv:
        data, name = open(argv[0], "rb").read(), argv[0]
    else:
        path = resources.files("pxvm.examples").joinpath("dot_test.pxi")
        data, name = path.read_bytes(), f"pxvm/examples/{path.name}"
    img = load_pxi(data)
    print(f"{BAR}\npxVM CPU vs GPU COMPARISON\n{BAR}\n")
    print(f"Test program: {name}\nTest program size: {len(data)} bytes\n")
    t0 = time.perf_counter()
    cpu = run_program_cpu(img)
    t_cpu = time.perf_counter() - t0
    print(f"{BAR}\nCPU EXECUTION\n{BAR}")
    print(f"Result: {int(cpu[3, 0, 0]) + 256 * int(cpu[3, 0, 1])} (pixel (0,3))")
    print(f"Encoding: R={cpu[3, 0, 0]}, G={cpu[3, 0, 1]}   time {t_cpu * 1e3:.2f} ms\n")
    try:
        backend = webgpu_backend()
    except PxvmError as exc:
        print(f"GPU execution not available: {exc}")
        return 1
    run_program_gpu(img, backend)
    t0 = time.perf_counter()
    gpu = run_program_gpu(img, backend)
    t_gpu = time.perf_counter() - t0
    print(f"{BAR}\nGPU EXECUTION ({backend.describe()})\n{BAR}")
    print(f"Result: {int(gpu[3, 0, 0]) + 256 * int(gpu[3, 0, 1])} (pixel (0,3))")
    print(f"Encoding: R={gpu[3, 0, 0]}, G={gpu[3, 0, 1]}   time {t_gpu * 1e3:.2f} ms\n")
    print(f"{BAR}\nCOMPARISON\n{BAR}\n")
    same = np.array_equal(cpu, gpu)
    if same:
        print("IDENTICAL RESULTS: every pixel of the two output images is equal.\n")
        print("The Pixel Protocol is executor-agnostic!")
        print("Same .pxi file, same results, different executors.")
    else:
        diff = np.argwhere(np.any(cpu != gpu, axis=2))
        print(f"DIFFERENT: {len(diff)} pixels differ, first at (x={diff[0][1]}, y={diff[0][0]})")
    print(BAR)
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
