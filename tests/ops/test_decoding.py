"""Decoding steps (pxvm.ops.decoding): greedy_step takes the first maximum and advances the
state's position, writing the history; sample_step draws on the GPU the token numpy
draws, distributed as softmax(logits / temperature); both refuse bad operands clearly."""

import numpy as np
import pytest

import pxvm
from pxvm.batch import Batch
from pxvm.ops.decoding import greedy_step, sample_step, sampled_logits
from pxvm.core.errors import ShapeError


def _backend(name, request):
    """The backend `name`, skipping where the GPU one is needed and missing."""
    if name == "gpu":
        request.getfixturevalue("gpu_device")
    return pxvm.get_backend(name)


# ---- greedy_step ---------------------------------------------------------------------

GREEDY_CASES = [  # (logits shape, indices set to the shared maximum)
    ((37,), [5, 20]),
    ((4097,), [4095, 4096]),        # a tie across the 4096-element chunks of the GPU pass
    ((9001,), [4242, 8000, 17]),    # the first maximum is not the first one listed
    ((9001,), [8191, 9000]),        # ties only in later chunks
    ((3, 50), [77, 149]),           # 2-D logits: the flat index
    ((1, 4096), []),                # exactly one chunk, no tie
]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("shape,ties", GREEDY_CASES)
def test_greedy_step_takes_the_first_maximum_and_advances_the_position(shape, ties, backend,
                                                                       rng, request):
    be = _backend(backend, request)
    logits = rng.standard_normal(shape).astype(np.float32)
    flat = logits.reshape(-1)
    flat[ties] = flat.max() + 0.5
    state = be.from_numpy(np.array([-5, 41], np.int32))
    greedy_step(logits, state)
    expected = int(np.argmax(logits))
    assert expected == (min(ties) if ties else expected)
    assert state.numpy().tolist() == [expected, 42]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_greedy_step_agrees_with_numpy_on_special_values(backend, request):
    be = _backend(backend, request)
    cases = [np.full(300, 2.5, np.float32),                        # all equal: index 0
             np.full(5000, -np.inf, np.float32),                   # all -inf: index 0
             np.where(np.arange(5000) == 4321, np.inf, -1.0).astype(np.float32),
             np.where(np.arange(5000) % 1000 == 999, np.nan, 1.0).astype(np.float32)]
    state = be.from_numpy(np.array([0, 0], np.int32))
    for i, logits in enumerate(cases):
        greedy_step(logits, state)
        assert state.numpy().tolist() == [int(np.argmax(logits)), i + 1], i


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_greedy_steps_in_one_batch_advance_once_each(backend, rng, request):
    be = _backend(backend, request)
    state = be.from_numpy(np.array([0, 7], np.int32))
    rows = rng.standard_normal((3, 257)).astype(np.float32)
    with Batch(be) as b:
        for row in rows:
            greedy_step(row, state)
    b.execute()
    assert state.numpy().tolist() == [int(np.argmax(rows[-1])), 10]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_greedy_steps_write_each_token_into_the_history_slot_of_its_position(backend, rng,
                                                                              request):
    be = _backend(backend, request)
    start, history = 5, 4
    state = be.from_numpy(np.array([0, start] + [-1] * history, np.int32))
    rows = rng.standard_normal((6, 4099)).astype(np.float32)
    with Batch(be) as b:
        for row in rows:
            greedy_step(row, state)
    b.execute()
    tokens = [int(np.argmax(row)) for row in rows]
    slots = [-1] * history
    for i, token in enumerate(tokens):  # the token of step i goes to (start + i) % history
        slots[(start + i) % history] = token
    assert state.numpy().tolist() == [tokens[-1], start + len(rows)] + slots
    assert sorted(slots) == sorted(tokens[-history:])


@pytest.mark.parametrize("logits,state,message", [
    (np.ones(5, np.float32), np.array([0.0, 1.0], np.float32),
     "greedy_step: input state has dtype float32, expected int32"),
    (np.ones(5, np.float32), np.array([0], np.int32), "state must be a 1-D int32"),
    (np.ones(5, np.float32), np.zeros((1, 2), np.int32), "state must be a 1-D int32"),
    (np.ones(0, np.float32), np.zeros(2, np.int32), "greedy_step"),
    (np.ones(5, np.int32), np.zeros(2, np.int32),
     "greedy_step: input logits has dtype int32, expected float32"),
])
@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_greedy_step_refuses_bad_operands_clearly(logits, state, message, backend, request):
    _backend(backend, request)
    with pytest.raises(ShapeError, match=message):
        greedy_step(logits, state, backend=backend)


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
        be = pxvm.get_backend(backend)
        state = be.from_numpy(np.array([-1, 40, -1, -1], np.int32))
        sampler = be.from_numpy(np.array([temperature, seed, counter], np.float32))
        sample_step(logits, state, sampler)
        draws[backend] = (state.numpy().tolist(), sampler.numpy().tolist())
    token = int(np.argmax(sampled_logits(logits, temperature, seed, counter)))
    # history slot 40 % 2 = 0; the counter advanced
    after = np.array([temperature, seed, counter + 1], np.float32).tolist()
    assert draws["cpu"] == draws["gpu"] == ([token, 41, token, -1], after)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_sample_step_with_temperature_zero_is_greedy(backend, rng, request):
    be = _backend(backend, request)
    logits = rng.standard_normal(5000).astype(np.float32)
    state = be.from_numpy(np.array([0, 3], np.int32))
    sampler = be.from_numpy(np.array([0.0, 7, 0], np.float32))
    sample_step(logits, state, sampler)
    assert state.numpy().tolist() == [int(np.argmax(logits)), 4]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_sample_step_draws_follow_softmax_of_logits_over_temperature(backend, request):
    """Chained steps (the counter advancing on the device) against the distribution
    computed directly: a chi-square test over 2,000 draws."""
    be = _backend(backend, request)
    logits = np.array([1.0, 0.2, -0.5, 2.0, 0.0, 1.5], np.float32)
    temperature, draws = 0.8, 2000
    per_batch = 500  # each step's token lands in history[position % per_batch]
    state = be.from_numpy(np.zeros(2 + per_batch, np.int32))
    sampler = be.from_numpy(np.array([temperature, 2024, 0], np.float32))
    tokens = []
    for _ in range(draws // per_batch):
        with Batch(be) as b:
            for _ in range(per_batch):
                sample_step(logits, state, sampler)
        b.execute()
        tokens += state.numpy()[2:].tolist()
    assert sampler.numpy()[2] == draws
    expected = np.exp(logits / temperature) / np.exp(logits / temperature).sum() * draws
    observed = np.bincount(tokens, minlength=logits.size)
    chi2 = float(((observed - expected) ** 2 / expected).sum())
    assert chi2 < 20.5, (observed, expected.round(1))  # 5 degrees of freedom, p = 0.001


def test_sample_step_refuses_a_bad_sampler_clearly():
    with pytest.raises(ShapeError, match=r"sampler must be a float32 tensor \[temperature"):
        sample_step(np.ones(5, np.float32), np.zeros(2, np.int32), np.zeros(2, np.float32),
                    backend="cpu")


def test_decoding_steps_are_not_in_the_general_op_namespace():
    # They live in pxvm.ops.decoding (and the registry), not beside the general ops.
    assert not hasattr(pxvm.ops, "greedy_step") and not hasattr(pxvm.ops, "sample_step")
    assert pxvm.ops.REGISTRY["greedy_step"] is greedy_step
    assert pxvm.ops.REGISTRY["sample_step"] is sample_step
