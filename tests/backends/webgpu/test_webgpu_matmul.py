"""The WebGPU matrix kernels (pxvm.backends.webgpu.ops.matmul): every tile shape of the
blocked kernel with vector and scalar loads, the choice of shape and entry point, and
matmul_f16's kernels (one output a thread, f32 products, f16 products summed in f32)
against numpy."""

import numpy as np
import pytest

import pxvm
from pxvm.backends.webgpu.ops import matmul as matmul_module
from pxvm.core import tuning
from pxvm.web.plans import record_op
from conftest import NMSE_LONG, assert_close


#: (M, K, N) for the blocked kernels' vector loads (K and N multiples of 4, K not of 8)
#: and for their scalar loads (anything): one row, one column, partial tiles on every
#: side, a partial last K slice, several slices
ALIGNED = [(1, 12, 4), (7, 20, 300), (129, 36, 8), (300, 44, 132)]
UNALIGNED = [(1, 1, 1), (7, 33, 5), (129, 7, 300), (300, 37, 129)]


def _operands(rng, m, k, n, transpose_b, dtype=np.float32):
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(dtype)
    expected = a.astype(np.float64) @ (b.T if transpose_b else b).astype(np.float64)
    return a, b, expected


def _shape_runs():
    """Every tile shape with vector loads; the default and the two-run shapes also with
    scalar loads (the entry points share everything but their loads)."""
    for shape in matmul_module.BLOCKED_SHAPES:
        yield shape, True
    for shape in ("128x128x8", "64x64x8"):
        yield shape, False


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("shape,aligned", list(_shape_runs()))
def test_blocked_shapes_match_numpy(gpu_device, rng, shape, aligned, transpose_b):
    need = matmul_module.workgroup_bytes(shape)
    if need > gpu_device.limits["max-compute-workgroup-storage-size"]:
        pytest.skip(f"{shape} needs {need} bytes of workgroup memory")
    for m, k, n in ALIGNED if aligned else UNALIGNED:
        a, b, expected = _operands(rng, m, k, n, transpose_b)
        with tuning.forcing(matmul_module.SHAPE_TUNED, shape):  # the blocked kernel, any M
            got = pxvm.ops.matmul(a, b, transpose_b=transpose_b, backend="gpu").numpy()
        assert_close(got, expected, NMSE_LONG)


def test_auto_takes_the_blocked_kernel_with_vector_loads_where_rows_align():
    a, b = np.ones((256, 256), np.float32), np.ones((256, 256), np.float32)
    [dispatch] = record_op(pxvm.ops.matmul, [a, b], {})["dispatches"]
    assert (dispatch["kernel"], dispatch["entry"]) == ("matmul_blocked.wgsl", "main_vec4")
    [dispatch] = record_op(pxvm.ops.matmul, [a[:, :255], b[:255]], {})["dispatches"]
    assert (dispatch["kernel"], dispatch["entry"]) == ("matmul_blocked.wgsl", "main")


def test_blocked_shape_choice_keeps_enough_workgroups():
    big = matmul_module.choose_shape(4096, 4096)
    assert big == matmul_module.FP32_SHAPES[0]
    small = matmul_module.choose_shape(64, 64)
    assert small == matmul_module.FP32_SHAPES[-1]
    for m, n in [(4096, 4096), (1024, 1024), (512, 1536), (300, 70)]:
        rows, cols, _ = matmul_module.BLOCKED_SHAPES[matmul_module.choose_shape(m, n)]
        groups = -(-m // rows) * -(-n // cols)
        assert groups >= matmul_module.MIN_WORKGROUPS or rows * cols == 64 * 64


@pytest.fixture
def f16_kernel(monkeypatch, forced):
    """Forces matmul_f16's kernel (and optionally its tile shape and f16 run) for one
    test."""
    def use(kernel, shape=None, half_steps=None):
        forced(matmul_module.F16_KERNEL_TUNED, kernel)
        forced(matmul_module.F16_SHAPE_TUNED, shape)
        if half_steps is not None:
            monkeypatch.setattr(matmul_module, "HALF_STEPS", half_steps)
    return use


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 5), (64, 130, 31)])
def test_matmul_f16_on_webgpu_matches_its_reference(gpu_device, rng, f16_kernel, transpose_b,
                                                    m, k, n):
    f16_kernel("naive")
    a, b, expected = _operands(rng, m, k, n, transpose_b, np.float16)
    got = pxvm.ops.matmul_f16(a, b, transpose_b=transpose_b, backend="gpu").numpy()
    assert got.dtype == np.float32
    assert_close(got, expected, 1e-10)  # float16 products are exact in float32


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("aligned", [True, False])
def test_matmul_f16_blocked_multiplies_exactly_in_f32(gpu_device, rng, f16_kernel, aligned,
                                                      transpose_b):
    # 128x128x16: two runs of each operand a thread (64x64x4 in the f16-product test: one)
    f16_kernel("blocked", "128x128x16")
    for m, k, n in ALIGNED if aligned else UNALIGNED:
        a, b, expected = _operands(rng, m, k, n, transpose_b, np.float16)
        got = pxvm.ops.matmul_f16(a, b, transpose_b=transpose_b, backend="gpu").numpy()
        assert_close(got, expected, 1e-10)


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("aligned", [True, False])
@pytest.mark.parametrize("shape,half_steps", [("128x128x16", 32), ("64x64x4", 8)])
def test_matmul_f16_half_products_match_numpy(gpu_device, rng, f16_kernel, shape, half_steps,
                                              aligned, transpose_b):
    if not gpu_device.has("shader-f16"):
        pytest.skip(f"{gpu_device.name} has no shader-f16")
    f16_kernel("half", shape, half_steps)
    for m, k, n in ALIGNED if aligned else UNALIGNED:
        a, b, expected = _operands(rng, m, k, n, transpose_b, np.float16)
        got = pxvm.ops.matmul_f16(a, b, transpose_b=transpose_b, backend="gpu").numpy()
        assert got.dtype == np.float32
        assert_close(got, expected, NMSE_LONG)


def test_matmul_f16_half_adds_its_f16_sums_into_f32_every_half_steps(gpu_device, f16_kernel):
    # 16 * 16 = 256 a product: 320 of them sum to 81920, beyond float16's 65504, but every
    # partial sum of 32 (8192) and the total are exact in f32.
    if not gpu_device.has("shader-f16"):
        pytest.skip(f"{gpu_device.name} has no shader-f16")
    f16_kernel("half", "64x64x8", 32)
    a = np.full((65, 320), 16, np.float16)
    b = np.full((320, 66), 16, np.float16)
    got = pxvm.ops.matmul_f16(a, b, backend="gpu").numpy()
    np.testing.assert_array_equal(got, np.full((65, 66), 81920, np.float32))


@pytest.mark.parametrize("features,tuned,kernel,entry", [
    ((), None, "matmul_blocked.wgsl", "main_f16_vec"),
    (("shader-f16",), None, "matmul_blocked.wgsl", "main_f16_vec"),
    ((), "half", "matmul_blocked.wgsl", "main_f16_vec"),  # f16 products need shader-f16
    (("shader-f16",), "half", "matmul_f16_half.wgsl", "main_vec"),
])
def test_matmul_f16_kernel_follows_the_adapters_features_and_tuning(features, tuned, kernel,
                                                                    entry):
    a, b = np.ones((128, 64), np.float16), np.ones((64, 128), np.float16)
    with tuning.forcing(matmul_module.F16_KERNEL_TUNED, tuned):
        [dispatch] = record_op(pxvm.ops.matmul_f16, [a, b], {}, features)["dispatches"]
    assert (dispatch["kernel"], dispatch["entry"]) == (kernel, entry)
    [dispatch] = record_op(pxvm.ops.matmul_f16, [a[:4], b], {}, features)["dispatches"]
    assert dispatch["kernel"] == "matmul_f16.wgsl"  # a few rows: one output a thread
