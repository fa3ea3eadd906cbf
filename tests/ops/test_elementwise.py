"""Element-wise ops: WGSL against the numpy reference, odd shapes, NaN/inf, broadcasting."""

import numpy as np
import pytest

import pxvm
from conftest import NMSE_ELEMENTWISE, ODD_SIZES, assert_close, nmse

UNARY = [
    ("relu", {}), ("leaky_relu", {"alpha": 0.1}), ("elu", {"alpha": 0.7}), ("sigmoid", {}),
    ("tanh", {}), ("silu", {}), ("gelu_tanh", {}), ("gelu", {}), ("clip", {"lo": -0.5, "hi": 0.8}),
    ("scale", {"factor": -2.5}),
]


@pytest.mark.parametrize("name,params", UNARY)
@pytest.mark.parametrize("n", ODD_SIZES + (70001,))
def test_unary_op_matches_numpy_reference(gpu_device, rng, name, params, n):
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    op = getattr(pxvm.ops, name)
    got = op(x, backend="gpu", **params).numpy()
    assert_close(got, op.reference(x, **params), NMSE_ELEMENTWISE)


@pytest.mark.parametrize("name,params", UNARY)
def test_unary_op_is_accurate_across_magnitudes(gpu_device, rng, name, params):
    """Tiny, ordinary and huge inputs, each judged on its own (an NMSE over one element is
    a relative error): catches cancellation and poor builtins near 0 and in the tails."""
    x = np.concatenate([rng.standard_normal(2000) * scale for scale in (1e-6, 1e-3, 0.1, 4, 30)])
    x = x.astype(np.float32)
    op = getattr(pxvm.ops, name)
    got, expected = op(x, backend="gpu", **params).numpy(), op.reference(x, **params)
    worst = max(nmse(got[i:i + 1], expected[i:i + 1]) for i in range(x.size))
    assert worst <= NMSE_ELEMENTWISE


@pytest.mark.parametrize("name,params", UNARY)
def test_unary_op_propagates_nan_and_inf_like_numpy(gpu_device, name, params):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 3.0], np.float32)
    op = getattr(pxvm.ops, name)
    assert_close(op(x, backend="gpu", **params).numpy(), op.reference(x, **params), NMSE_ELEMENTWISE)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "div", "maximum", "minimum"])
@pytest.mark.parametrize("shapes", [((33,), (33,)), ((7, 33), (33,)), ((257, 1), (1, 7)),
                                    ((2, 3, 5, 7), (3, 1, 7)), ((1,), (5, 1))])
def test_binary_op_broadcasts_like_numpy(gpu_device, rng, name, shapes):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32) + 0.1
    op = getattr(pxvm.ops, name)
    assert_close(op(a, b, backend="gpu").numpy(), op.reference(a, b), NMSE_ELEMENTWISE)


@pytest.mark.parametrize("name", ["add", "sub", "mul", "maximum", "minimum"])
@pytest.mark.parametrize("dtype", [np.int32, np.uint32])
def test_integer_binary_op_is_exact_including_wraparound(gpu_device, rng, name, dtype):
    info = np.iinfo(dtype)
    a = rng.integers(info.min, info.max, size=(7, 33), dtype=np.int64).astype(dtype)
    b = rng.integers(info.min, info.max, size=(33,), dtype=np.int64).astype(dtype)
    op = getattr(pxvm.ops, name)
    np.testing.assert_array_equal(op(a, b, backend="gpu").numpy(), op.reference(a, b))


def test_cpu_and_gpu_backends_share_the_reference(rng):
    x = rng.standard_normal(9).astype(np.float32)
    np.testing.assert_array_equal(pxvm.ops.relu(x, backend="cpu").numpy(), pxvm.ops.relu.reference(x))


def test_mismatched_shapes_raise_a_clear_error_on_both_backends(rng):
    a, b = np.ones((3, 4), np.float32), np.ones((5,), np.float32)
    for backend in ("cpu", "gpu"):
        with pytest.raises(pxvm.ShapeError, match=r"\(3, 4\) and \(5,\) cannot be broadcast"):
            pxvm.ops.add(a, b, backend=backend)


def test_ops_chain_on_device_without_readback(gpu_device, rng):
    x = pxvm.tensor(rng.standard_normal(100).astype(np.float32), backend="gpu")
    y = pxvm.ops.scale(pxvm.ops.relu(x), 3.0)
    assert isinstance(y, pxvm.Tensor) and y.backend.name == "webgpu"
    assert_close(y.numpy(), np.maximum(x.numpy(), 0) * 3, NMSE_ELEMENTWISE)
