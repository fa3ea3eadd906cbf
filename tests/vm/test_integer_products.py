"""pxVM programs whose products run on the integer kernels (pxvm.backends.cpu.kernels.integer)
byte-identical to the float32 BLAS path (the fallback without numba, and the path of
small products in a process that has not loaded numba) and to the GPU executor."""

import os
import subprocess
import sys
from pathlib import Path

import numpy as np

from pxvm.vm import cpu as cpu_executor
from pxvm.vm import run_program_cpu, run_program_gpu
from pxvm.vm.assembler import assemble
from programs import random_program


def matmul_source(opcode, a, b, width=97):
    (m, k), n = a.shape, b.shape[1]

    def rows(size):
        return -(-size // (width - 1))

    rb, rc = 1 + rows(m * k), 1 + rows(m * k) + rows(k * n)
    return "\n".join([f".size {width} {rc + rows(m * n)}", f"{opcode} 1 {rb} {rc}",
                      f".matrix 1 {m} {k} {' '.join(map(str, a.ravel()))}",
                      f".matrix {rb} {k} {n} {' '.join(map(str, b.ravel()))}"])


def test_matmul_programs_match_the_blas_path_and_the_gpu(gpu_device, rng, monkeypatch):
    """Saturated u8 products, long int8 sums and shapes off every block edge, on the
    numba kernels, on the float32 BLAS fallback and on the GPU."""
    images = [
        assemble(matmul_source("MATMUL", rng.integers(0, 256, (9, 300)),
                               rng.integers(0, 3, (300, 45)))),
        assemble(matmul_source("MATMUL", rng.integers(0, 4, (6, 7)), rng.integers(0, 4, (7, 70)))),
        assemble(matmul_source("MATMUL_I8", np.full((5, 600), -128), np.full((600, 33), -128))),
        assemble(matmul_source("MATMUL_I8", rng.integers(-128, 128, (37, 129)),
                               rng.integers(-128, 128, (129, 67)))),
    ] + [random_program(int(seed)) for seed in rng.integers(0, 2**32, 20)]
    monkeypatch.setattr(cpu_executor, "INTEGER_KERNELS_AFTER_SECONDS", 0)
    monkeypatch.setattr(cpu_executor, "INTEGER_KERNELS_MIN_WORK", 0)
    with_kernels = [run_program_cpu(img) for img in images]
    monkeypatch.setattr(cpu_executor, "_integer_kernel", lambda entry, work: None)
    for img, out in zip(images, with_kernels):
        np.testing.assert_array_equal(out, run_program_cpu(img))
        np.testing.assert_array_equal(out, run_program_gpu(img))


def test_a_program_in_a_new_process_does_not_wait_for_numba():
    # numba takes about half a second to load: one program must not pay for it
    code = ("import sys, numpy as np\n"
            "from pxvm.vm import run_program_cpu\n"
            "from pxvm.vm.assembler import assemble\n"
            "from test_integer_products import matmul_source\n"
            "img = assemble(matmul_source('MATMUL_I8', np.ones((20, 30), int), "
            "np.ones((30, 40), int)))\n"
            "out = run_program_cpu(img)\n"
            "print('numba' in sys.modules)\n")
    here = str(Path(__file__).parent)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "PYTHONPATH": here})
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"
