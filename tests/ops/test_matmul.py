"""matmul and matmul_f16: every kernel, tile shape and layout against numpy, odd shapes,
properties, errors."""

import importlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pxvm
from pxvm.runtime.errors import BindingTooLargeError
from pxvm.ops import tuning
from pxvm.web.plans import record_op
from conftest import NMSE_LONG, assert_close

matmul_module = importlib.import_module("pxvm.ops.matmul")  # the module, not the op

SHAPES = [(1, 1, 1), (1, 7, 33), (7, 1, 5), (33, 257, 7), (65, 70, 129), (257, 33, 130),
          (3, 576, 192), (128, 64, 64), (64, 16, 128)]


@pytest.mark.parametrize("kernel", ["auto", "naive", "tiled", "tiled_wide", "gemv", "blocked"])
@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matmul_matches_numpy(gpu_device, rng, kernel, transpose_b, m, k, n):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b_arg = np.ascontiguousarray(b.T) if transpose_b else b
    got = pxvm.ops.matmul(a, b_arg, transpose_b=transpose_b, kernel=kernel, backend="gpu").numpy()
    assert_close(got, a.astype(np.float64) @ b, NMSE_LONG)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 150), k=st.integers(1, 150), n=st.integers(1, 150),
       transpose_b=st.booleans(),
       kernel=st.sampled_from(["auto", "naive", "tiled", "tiled_wide", "gemv", "blocked"]),
       seed=st.integers(0, 2**32 - 1))
def test_matmul_property_over_shapes(gpu_device, m, k, n, transpose_b, kernel, seed):
    r = np.random.default_rng(seed)
    a = r.standard_normal((m, k)).astype(np.float32)
    b = r.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    got = pxvm.ops.matmul(a, b, transpose_b=transpose_b, kernel=kernel, backend="gpu").numpy()
    assert_close(got, pxvm.ops.matmul.reference(a, b, transpose_b), NMSE_LONG)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_gemv_grid_beyond_65535_workgroups_in_x(gpu_device, rng, transpose_b):
    # 4 x 140001 outputs at 8 per workgroup need 70001 workgroups: a 2-D grid.
    m, k, n = 4, 3, 140001
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    got = pxvm.ops.matmul(a, b, transpose_b=transpose_b, kernel="gemv", backend="gpu").numpy()
    assert_close(got, pxvm.ops.matmul.reference(a, b, transpose_b), NMSE_LONG)


def test_matmul_chains_on_device(gpu_device, rng):
    a = rng.standard_normal((33, 20)).astype(np.float32)
    b = rng.standard_normal((20, 40)).astype(np.float32)
    c = rng.standard_normal((40, 7)).astype(np.float32)
    got = pxvm.ops.matmul(pxvm.ops.matmul(a, b, backend="gpu"), c).numpy()
    assert_close(got, a.astype(np.float64) @ b @ c, NMSE_LONG)


def test_inner_dimension_mismatch_names_both_shapes():
    for backend in ("cpu", "gpu"):
        with pytest.raises(pxvm.ShapeError, match=r"A is \(3, 4\), B is \(5, 6\)"):
            pxvm.ops.matmul(np.ones((3, 4), np.float32), np.ones((5, 6), np.float32), backend=backend)


def test_transpose_b_mismatch_and_non_2d_operands_are_refused():
    with pytest.raises(pxvm.ShapeError, match=r"A is \(3, 4\), B is \(4, 6\) \(transpose_b"):
        pxvm.ops.matmul(np.ones((3, 4), np.float32), np.ones((4, 6), np.float32),
                        transpose_b=True, backend="gpu")
    with pytest.raises(pxvm.ShapeError, match=r"2-D operands, got shapes \(4,\) and \(4, 2\)"):
        pxvm.ops.matmul(np.ones(4, np.float32), np.ones((4, 2), np.float32), backend="gpu")
    with pytest.raises(pxvm.ShapeError, match="kernel must be one of"):
        pxvm.ops.matmul(np.ones((2, 2), np.float32), np.ones((2, 2), np.float32), kernel="fast")


def test_operand_over_the_binding_limit_is_refused_with_both_sizes(gpu_device):
    rows = gpu_device.max_binding // (4 * 64) + 1
    a = np.broadcast_to(np.float32(1), (rows, 64))  # one host copy, made by the upload
    with pytest.raises(BindingTooLargeError,
                       match=f"{rows * 64 * 4:,} bytes.*{gpu_device.max_binding:,} bytes"):
        pxvm.ops.matmul(a, np.ones((64, 2), np.float32), backend="gpu")


def test_result_over_the_binding_limit_is_refused_before_any_dispatch(gpu_device):
    # Tiny operands, too large a product: (M, 1) @ (1, N) with M * N * 4 over the limit.
    m = 1024
    n = gpu_device.max_binding // (4 * m) + 1
    a = np.ones((m, 1), np.float32)
    b = np.ones((1, n), np.float32)
    with pytest.raises(BindingTooLargeError,
                       match=f"{m * n * 4:,} bytes.*{gpu_device.max_binding:,} bytes"):
        pxvm.ops.matmul(a, b, backend="gpu")


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
        got = pxvm.ops.matmul(a, b, transpose_b=transpose_b, kernel=f"blocked_{shape}",
                              backend="gpu").numpy()
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
def f16_kernel(monkeypatch):
    """Sets ops.matmul's F16_KERNEL (and optionally its shapes) for one test."""
    def use(kernel, shapes=None, half_steps=None):
        monkeypatch.setattr(matmul_module, "F16_KERNEL", kernel)
        if shapes is not None:
            monkeypatch.setattr(matmul_module, "HALF_SHAPES", shapes)
            monkeypatch.setattr(matmul_module, "F16_BLOCKED_SHAPES", shapes)
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
    f16_kernel("blocked", ("128x128x16",))
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
    f16_kernel("half", (shape,), half_steps)
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
    f16_kernel("half", ("64x64x8",), 32)
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
    with tuning.forcing("matmul_f16.webgpu", tuned):
        [dispatch] = record_op(pxvm.ops.matmul_f16, [a, b], {}, features)["dispatches"]
    assert (dispatch["kernel"], dispatch["entry"]) == (kernel, entry)
    [dispatch] = record_op(pxvm.ops.matmul_f16, [a[:4], b], {}, features)["dispatches"]
    assert dispatch["kernel"] == "matmul_f16.wgsl"  # a few rows: one output a thread
