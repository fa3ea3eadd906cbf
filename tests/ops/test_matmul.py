"""matmul on WebGPU against numpy at odd shapes (each kernel the op chooses by shape:
gemv, naive, blocked), properties, errors. (Every tile shape and the float16 kernels:
tests/backends/webgpu/test_webgpu_matmul.py.)"""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pxvm
from pxvm.core.errors import BindingTooLargeError
from conftest import NMSE_LONG, assert_close

SHAPES = [(1, 1, 1), (1, 7, 33), (7, 1, 5), (33, 257, 7), (65, 70, 129), (257, 33, 130),
          (3, 576, 192), (128, 64, 64), (64, 16, 128)]


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m,k,n", SHAPES)
def test_matmul_matches_numpy(gpu_device, rng, transpose_b, m, k, n):
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((k, n)).astype(np.float32)
    b_arg = np.ascontiguousarray(b.T) if transpose_b else b
    got = pxvm.ops.matmul(a, b_arg, transpose_b=transpose_b, backend="gpu").numpy()
    assert_close(got, a.astype(np.float64) @ b, NMSE_LONG)


@settings(max_examples=25, deadline=None)
@given(m=st.integers(1, 150), k=st.integers(1, 150), n=st.integers(1, 150),
       transpose_b=st.booleans(), seed=st.integers(0, 2**32 - 1))
def test_matmul_property_over_shapes(gpu_device, m, k, n, transpose_b, seed):
    r = np.random.default_rng(seed)
    a = r.standard_normal((m, k)).astype(np.float32)
    b = r.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    got = pxvm.ops.matmul(a, b, transpose_b=transpose_b, backend="gpu").numpy()
    assert_close(got, pxvm.ops.matmul.reference(a, b, transpose_b), NMSE_LONG)


@pytest.mark.parametrize("transpose_b", [False, True])
def test_gemv_grid_beyond_65535_workgroups_in_x(gpu_device, rng, transpose_b):
    # 4 rows take gemv; 4 x 140001 outputs at 8 per workgroup need 70001 workgroups: a
    # 2-D grid.
    m, k, n = 4, 3, 140001
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    got = pxvm.ops.matmul(a, b, transpose_b=transpose_b, backend="gpu").numpy()
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
