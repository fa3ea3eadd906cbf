"""Tensor: in-place writes from the host on both backends, views without copies, and the
dtypes a tensor may hold."""

from __future__ import annotations

import numpy as np
import pytest

import pxvm
from pxvm.core import as_supported_array, dtype_name
from pxvm.core.errors import ShapeError


@pytest.fixture(params=["numpy", "webgpu"])
def backend(request):
    if request.param == "webgpu":
        request.getfixturevalue("gpu_device")
    return pxvm.get_backend(request.param)


def test_tensor_write_replaces_values_in_place(backend, rng):
    t = backend.from_numpy(np.zeros((3, 5), np.int32) + 9)
    storage = t.storage
    values = rng.integers(-100, 100, (15,)).astype(np.int32)
    t.write(values)   # any shape with the same element count
    assert t.storage is storage
    np.testing.assert_array_equal(t.numpy(), values.reshape(3, 5))
    with pytest.raises(ShapeError, match=r"cannot write 14 values into a tensor of shape \(3, 5\)"):
        t.write(values[:14])


@pytest.mark.parametrize("dtype,count", [(np.uint8, 37), (np.float16, 5), (np.uint8, 3)])
def test_tensor_write_of_a_length_not_a_multiple_of_four_bytes(dtype, count, backend, rng):
    # float16 tensors live on every device, shader-f16 or not (their bytes)
    values = rng.integers(-100, 100, count).astype(dtype)
    t = backend.from_numpy(np.ones(count, dtype))
    t.write(values)
    np.testing.assert_array_equal(t.numpy(), values)


def test_reshape_and_prefix_are_views_of_the_same_storage(backend, rng):
    values = rng.standard_normal((4, 6)).astype(np.float32)
    t = backend.from_numpy(values)
    flat = t.reshape(-1)
    assert flat.shape == (24,)
    assert t.reshape(3, -1).shape == (3, 8) and t.reshape((2, 12)).shape == (2, 12)
    top = t.prefix(2)
    assert top.shape == (2, 6)
    np.testing.assert_array_equal(top.numpy(), values[:2])
    new = rng.standard_normal(24).astype(np.float32)
    flat.write(new)  # seen through every view
    np.testing.assert_array_equal(t.numpy(), new.reshape(4, 6))
    np.testing.assert_array_equal(top.numpy(), new.reshape(4, 6)[:2])
    with pytest.raises(ShapeError, match=r"cannot reshape a tensor of shape \(4, 6\) to \(5, 5\)"):
        t.reshape(5, 5)
    with pytest.raises(ShapeError, match="prefix of 5 rows of a tensor with 4 rows"):
        t.prefix(5)


def test_python_data_take_the_natural_dtypes():
    assert as_supported_array([0.5, 2.0]).dtype == np.float32
    assert as_supported_array(3.0).dtype == np.float32
    assert as_supported_array([[1, 2], [3, 4]]).dtype == np.int32
    assert as_supported_array([True, False]).dtype == np.uint8
    assert as_supported_array(np.array([True, False])).dtype == np.uint8
    with pytest.raises(ShapeError, match=r"values 1099511627776\.\.1099511627776 do not fit in i32"):
        as_supported_array([2**40])
    with pytest.raises(ShapeError, match="overflow f32"):
        as_supported_array([1e300])


@pytest.mark.parametrize("array,fix", [(np.zeros(2), "astype(np.float32)"),
                                       (np.float64(1.5), "astype(np.float32)"),
                                       (np.arange(3), "astype(np.int32)"),
                                       (np.zeros(2, np.complex64), "astype(np.float32)")])
def test_wider_numpy_dtypes_are_refused_not_narrowed(array, fix):
    with pytest.raises(ShapeError, match=f"{np.asarray(array).dtype} data are not a pxvm "
                                         r"dtype .*not narrowed silently") as info:
        as_supported_array(array)
    assert fix in str(info.value) and "dtype=" in str(info.value)


def test_asking_for_a_dtype_converts_and_checks_the_values():
    big = np.array([1e20, -3.25])
    np.testing.assert_array_equal(as_supported_array(big, "f32"), big.astype(np.float32))
    assert as_supported_array(np.arange(5), "i32").dtype == np.int32
    assert as_supported_array(np.array([2.0, -7.0]), np.int32).tolist() == [2, -7]
    with pytest.raises(ShapeError, match="do not fit in u32"):
        as_supported_array(np.array([-1]), "u32")
    with pytest.raises(ShapeError, match="non-integral"):
        as_supported_array(np.array([0.5]), "i32")
    with pytest.raises(ShapeError, match="overflow f32"):
        as_supported_array(np.array([1e39]), "f32")
    assert np.isinf(as_supported_array(np.array([np.inf]), "f32")).all()  # inf stays inf
    assert [dtype_name(d) for d in (np.float32, np.float16, np.int32, np.uint32, np.uint8)] == \
        ["f32", "f16", "i32", "u32", "u8"]


def test_ops_refuse_float64_instead_of_squaring_1e20_into_inf():
    x = np.array([1e20, 2.0])
    with pytest.raises(ShapeError, match="float64 data .* not narrowed silently"):
        pxvm.ops.mul(x, x, backend="numpy")
    with pytest.raises(ShapeError, match="int64 data"):
        pxvm.ops.relu(np.arange(4), backend="numpy")
    asked = pxvm.tensor(x, backend="numpy", dtype="f32")
    assert pxvm.ops.mul(asked, asked).numpy()[1] == 4.0


def test_tensor_reports_shape_size_and_backend(backend):
    t = backend.from_numpy(np.zeros((2, 3, 4), np.float32))
    assert (t.ndim, t.size, t.nbytes) == (3, 24, 96)
    assert repr(t) == f"Tensor(shape=(2, 3, 4), dtype=f32, backend={backend.name})"
    np.testing.assert_array_equal(np.asarray(t, dtype=np.float64), np.zeros((2, 3, 4)))
