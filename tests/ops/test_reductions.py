"""Reductions: two-pass sum/max/dot for any length, argmax exact with numpy's tie and NaN
rules (the decoding steps built on argmax are in test_decoding.py)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pxvm
from conftest import NMSE_LONG, ODD_SIZES, assert_close
from pxvm.core.errors import ShapeError

LENGTHS = ODD_SIZES + (256 * 1024 + 3, 1_000_003)


@pytest.mark.parametrize("n", LENGTHS)
def test_sum_max_and_dot_match_numpy_for_any_length(gpu_device, rng, n):
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    assert_close(pxvm.ops.sum(a, backend="gpu").numpy(), np.sum(a, dtype=np.float64), NMSE_LONG)
    assert pxvm.ops.max(a, backend="gpu").numpy() == a.max()
    assert_close(pxvm.ops.dot(a, b, backend="gpu").numpy(), np.dot(a.astype(np.float64), b), NMSE_LONG)


def test_max_propagates_nan_and_handles_infinities(gpu_device, rng):
    a = rng.standard_normal(1000).astype(np.float32)
    a[10] = -np.inf
    assert pxvm.ops.max(a, backend="gpu").numpy() == a.max()
    a[500] = np.inf
    assert pxvm.ops.max(a, backend="gpu").numpy() == np.inf
    a[700] = np.nan
    assert np.isnan(pxvm.ops.max(a, backend="gpu").numpy())


@pytest.mark.parametrize("n", LENGTHS)
def test_flat_argmax_is_exact(gpu_device, rng, n):
    a = rng.standard_normal(n).astype(np.float32)
    assert int(pxvm.ops.argmax(a, backend="gpu").numpy()) == int(np.argmax(a))


def test_argmax_ties_pick_the_first_index_and_first_nan_wins(gpu_device, rng):
    a = rng.integers(0, 3, 9000).astype(np.float32)  # many ties at the maximum
    assert int(pxvm.ops.argmax(a, backend="gpu").numpy()) == int(np.argmax(a))
    a[6000], a[8000] = np.nan, np.nan
    assert int(pxvm.ops.argmax(a, backend="gpu").numpy()) == 6000 == int(np.argmax(a))


@pytest.mark.parametrize("shape", [(1, 1), (7, 33), (70001, 3), (3, 5000)])
def test_row_argmax_is_exact(gpu_device, rng, shape):
    a = rng.integers(-5, 5, shape).astype(np.float32)
    np.testing.assert_array_equal(pxvm.ops.argmax(a, axis=-1, backend="gpu").numpy(),
                                  np.argmax(a, axis=-1))


def test_row_argmax_ties_and_nan_follow_numpy(gpu_device, rng):
    a = rng.integers(0, 2, (5, 700)).astype(np.float32)  # ties in every row
    a[1, 650], a[1, 3] = np.nan, np.nan  # first NaN wins, even after later ones
    a[2, 400] = np.inf
    a[3, :] = np.nan
    np.testing.assert_array_equal(pxvm.ops.argmax(a, axis=-1, backend="gpu").numpy(),
                                  np.argmax(a, axis=-1))


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 20000), seed=st.integers(0, 2**32 - 1))
def test_reductions_property_over_lengths(gpu_device, n, seed):
    r = np.random.default_rng(seed)
    a = (r.standard_normal(n) * r.uniform(0.1, 100)).astype(np.float32)
    assert_close(pxvm.ops.sum(a, backend="gpu").numpy(), np.sum(a, dtype=np.float64), NMSE_LONG)
    assert pxvm.ops.max(a, backend="gpu").numpy() == a.max()
    assert int(pxvm.ops.argmax(a, backend="gpu").numpy()) == int(np.argmax(a))
    b = r.standard_normal(n).astype(np.float32)
    assert_close(pxvm.ops.dot(a, b, backend="gpu").numpy(), np.dot(a.astype(np.float64), b), NMSE_LONG)


def test_bad_operands_give_clear_errors():
    for backend in ("cpu", "gpu"):
        with pytest.raises(ShapeError, match="equal length, got 3 and 4"):
            pxvm.ops.dot(np.ones(3, np.float32), np.ones(4, np.float32), backend=backend)
        with pytest.raises(ShapeError, match="empty"):
            pxvm.ops.sum(np.ones(0, np.float32), backend=backend)
