"""Reductions: two-pass sum/max/dot for any length, argmax exact with numpy's tie and NaN
rules; the sampling step's draws on the GPU as in numpy, distributed as softmax(logits /
temperature)."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pxvm
from conftest import NMSE_LONG, ODD_SIZES, assert_close
from pxvm.batch import Batch
from pxvm.runtime.errors import ShapeError
from pxvm.ops.reductions import sampled_logits

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


# ---- sample_step ---------------------------------------------------------------------

@pytest.mark.parametrize("n,temperature,seed,counter", [
    (37, 0.7, 1, 0), (4099, 1.0, 12345, 17), (9001, 0.3, 99, 4096), (50, 2.5, 0, 3)])
def test_sample_step_on_the_gpu_draws_the_numpy_token(gpu_device, rng, n, temperature, seed,
                                                      counter):
    logits = rng.standard_normal(n).astype(np.float32)
    z = np.sort(sampled_logits(logits, temperature, seed, counter))
    assert z[-1] - z[-2] > 1e-4  # no near-tie that float rounding could flip
    draws = {}
    for backend in ("cpu", "gpu"):
        be = pxvm.backends.get_backend(backend)
        state = be.from_numpy(np.array([-1, 40, -1, -1], np.int32))
        sampler = be.from_numpy(np.array([temperature, seed, counter], np.float32))
        pxvm.ops.sample_step(logits, state, sampler)
        draws[backend] = (state.numpy().tolist(), sampler.numpy().tolist())
    token = int(np.argmax(sampled_logits(logits, temperature, seed, counter)))
    # history slot 40 % 2 = 0; the counter advanced
    after = np.array([temperature, seed, counter + 1], np.float32).tolist()
    assert draws["cpu"] == draws["gpu"] == ([token, 41, token, -1], after)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_sample_step_with_temperature_zero_is_greedy(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    be = pxvm.backends.get_backend(backend)
    logits = rng.standard_normal(5000).astype(np.float32)
    state = be.from_numpy(np.array([0, 3], np.int32))
    sampler = be.from_numpy(np.array([0.0, 7, 0], np.float32))
    pxvm.ops.sample_step(logits, state, sampler)
    assert state.numpy().tolist() == [int(np.argmax(logits)), 4]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_sample_step_draws_follow_softmax_of_logits_over_temperature(backend, request):
    """Chained steps (the counter advancing on the device) against the distribution
    computed directly: a chi-square test over 2,000 draws."""
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    be = pxvm.backends.get_backend(backend)
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0, 1.5], np.float32)
    temperature, draws = 0.8, 2000
    per_batch = 500  # each step's token lands in history[position % per_batch]
    state = be.from_numpy(np.zeros(2 + per_batch, np.int32))
    sampler = be.from_numpy(np.array([temperature, 2024, 0], np.float32))
    tokens = []
    for _ in range(draws // per_batch):
        b = Batch(be)
        for _ in range(per_batch):
            b.sample_step(logits, state, sampler)
        b.execute()
        tokens += state.numpy()[2:].tolist()
    assert sampler.numpy()[2] == draws
    expected = np.exp(logits / temperature) / np.exp(logits / temperature).sum() * draws
    observed = np.bincount(tokens, minlength=logits.size)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, (observed, expected.round(1))  # 5 degrees of freedom, p = 0.001


def test_sample_step_refuses_a_bad_sampler_clearly():
    with pytest.raises(ShapeError, match=r"sampler must be a float32 tensor \[temperature"):
        pxvm.ops.sample_step(np.ones(5, np.float32), np.zeros(2, np.int32),
                             np.zeros(2, np.float32), backend="cpu")
