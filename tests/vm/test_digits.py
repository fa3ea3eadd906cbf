"""The digits network compiled to a .pxi keeps the float model's accuracy (within one
point) and runs identically on both executors."""

import numpy as np
import pytest

pytest.importorskip("sklearn")

from pxvm.vm import run_program_cpu, run_program_gpu
from pxvm.vm.digits import compile_digits, predictions


def test_quantized_digits_program_matches_float_accuracy_on_both_executors(gpu_device):
    compiled = compile_digits(hidden=32)
    assert compiled.image.shape[0] > 256  # data past row 255: ROWHI addressing is exercised
    cpu = run_program_cpu(compiled.image)
    gpu = run_program_gpu(compiled.image)
    np.testing.assert_array_equal(cpu, gpu)
    acc = float(np.mean(predictions(cpu, compiled.out) == compiled.labels))
    assert compiled.float_accuracy > 0.9
    assert abs(acc - compiled.float_accuracy) <= 0.01
