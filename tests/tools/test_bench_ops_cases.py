"""pxvm.tools.bench_ops, the cases behind `pxvm bench ops` (tests/cli/test_bench_ops.py
runs the command): the quantized products' weights and shapes, each case's result
against its numpy reference."""

from __future__ import annotations

import numpy as np
import pytest

from pxvm.core import get_backend
from pxvm.ops.quant_types import dequantize
from pxvm.tools import bench_ops

QUANT_CASES = ["matmul_quant_q8_0", "matmul_quant_q4_k", "matmul_quant_q6_k"]
#: (values, bytes) of a block of each case's type, as GGML defines them
BLOCKS = {"matmul_quant_q8_0": (32, 34), "matmul_quant_q4_k": (256, 144),
          "matmul_quant_q6_k": (256, 210)}


def test_random_q6_k_blocks_dequantize_to_values_about_1_in_size(rng):
    w = bench_ops.quantized_weight(64, 1024, "Q6_K", rng)
    assert w.shape == (64, 1024 // 256 * 210) and w.dtype == np.uint8
    values = dequantize(w, "Q6_K", 1024)  # the gguf package's decoding
    assert values.shape == (64, 1024) and np.all(np.isfinite(values))
    assert 0.5 < np.sqrt(np.mean(values.astype(np.float64) ** 2)) < 2
    assert np.max(np.abs(values)) < 10
    assert np.std(values) > 0.5  # not one value repeated: the quants and scales vary


def test_quantized_products_default_to_llama_3_8b_shapes_and_sizes_mean_square():
    for name in QUANT_CASES:
        case = bench_ops.CASES[name]
        assert set(case.default) == {(4096, 4096), (14336, 4096), (4096, 14336)}
        assert case.from_size(1024) == (1024, 1024)
    assert bench_ops.CASES["matmul_quant_q6_k"].label((14336, 4096)).startswith(
        "Q6_K W 14336x4096, 1 row")


@pytest.mark.parametrize("backend_name", ["numpy", "cpu", "webgpu"])
@pytest.mark.parametrize("name", QUANT_CASES)
def test_quantized_products_check_out_against_numpy_at_a_quick_shape(name, backend_name, rng,
                                                                    request):
    if backend_name == "webgpu":
        request.getfixturevalue("gpu_device")
    case = bench_ops.CASES[name]
    shape, = case.quick
    row = bench_ops.run_case(case, shape, get_backend(backend_name), 1, rng)
    assert row.status == "ok", row.note
    assert row.pxvm_runs == ("reference" if backend_name == "numpy" else "kernel")
    assert 0 <= row.nmse <= case.nmse_limit and row.pxvm_seconds > 0
    n, k = shape  # the rate counts the weight's GGUF bytes
    values, nbytes = BLOCKS[name]
    assert row.work == n * k // values * nbytes
