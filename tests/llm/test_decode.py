"""Decoding's schedule (pxvm.llm.decode) on tiny random GGUF files: steps chained on the
device, several per submit, must choose what the model fed one token at a time chooses
(greedy and sampled, across the recorded steps' key bounds); stopping early; the
recorded steps and what each one launches."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf
from test_model import NMSE_MODEL

import pxvm.llm.decode as decode_module
from pxvm.llm import load_model
from pxvm.llm.decode import ContextOverflowError, step_bound
from pxvm.ops.decoding import sampled_logits

#: Dispatches of one recorded step of the two-layer tiny model, whatever its key bound:
#: 5 a layer (QKV, attention, O, SwiGLU, down), the embedding, the LM head and the
#: draw (2).
STEP_DISPATCHES = 2 * 5 + 4


def _greedy_token_by_token(model, prompt, n):
    """The prompt's argmax, then the n tokens greedy decoding chooses, each fed alone."""
    token = first = int(np.argmax(model.forward(prompt)))
    expected = []
    for _ in range(n):
        token = int(np.argmax(model.forward([token])))
        expected.append(token)
    return first, expected


@pytest.mark.parametrize("per_submit,launched", [(1, [1] * 12), (5, [5, 5, 2])])
@pytest.mark.parametrize("backend", ["numpy", "cpu", "webgpu"])
def test_decode_greedy_matches_argmax_of_forward_token_by_token(backend, per_submit, launched,
                                                                tmp_path, rng, request,
                                                                monkeypatch):
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    monkeypatch.setattr(decode_module, "STEPS_PER_SUBMIT", per_submit)
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=40), rng)
    prompt = rng.integers(0, 101, size=5).tolist()
    stepwise = load_model(str(path), backend=backend, progress=False)
    _, expected = _greedy_token_by_token(stepwise, prompt, 12)
    chained = load_model(str(path), backend=backend, progress=False)
    first = int(np.argmax(chained.forward(prompt)))
    launches = []
    graph = chained.decoder.step(chained.position)
    prepare = graph.prepare
    monkeypatch.setattr(graph, "prepare",
                        lambda *a, **k: launches.append(k["runs"]) or prepare(*a, **k))
    got = list(chained.decode_greedy(first, 12))
    assert got == expected
    assert chained.position == stepwise.position == 5 + 12
    # STEPS_PER_SUBMIT steps a submit, the last one what is left
    assert launches == launched


def test_decode_greedy_stopped_early_continues_from_the_received_tokens(tmp_path, rng, gpu_device):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=40), rng)
    model = load_model(str(path), backend="webgpu", progress=False)
    prompt = rng.integers(0, 101, size=6).tolist()
    first = int(np.argmax(model.forward(prompt)))
    stream = model.decode_greedy(first, 20)
    received = [next(stream) for _ in range(3)]
    stream.close()  # steps beyond these were already submitted; they must not count
    assert model.position == 6 + 3
    after = model.forward([received[-1]])
    fresh = load_model(str(path), backend="numpy", progress=False)
    fresh.forward(prompt + [first] + received[:-1])
    assert nmse(after, fresh.forward([received[-1]])) <= NMSE_MODEL
    with pytest.raises(ContextOverflowError, match="context of 40"):
        list(model.decode_greedy(1, 40))


def test_gpu_decode_step_is_recorded_once_and_replayed(tmp_path, rng, gpu_device):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(), rng)
    model = load_model(str(path), backend="webgpu", progress=False)
    model.forward([1, 2])
    model.forward([3])
    step = model.decoder.step(model.position)
    model.forward([4])
    list(model.decode_greedy(5, 3))
    assert model.decoder.step(model.position) is step
    # context 24: one span, so one recorded step served every token above
    assert model.decoder.recorded == {24: step}
    assert step.dispatches == STEP_DISPATCHES


def test_forgotten_steps_are_recorded_again_and_decode_the_same(tmp_path, rng, gpu_device):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(), rng)
    model = load_model(str(path), backend="webgpu", progress=False)
    model.forward([1, 2])
    step = model.decoder.step(model.position)
    before = list(model.decode_greedy(3, 5))
    model.decoder.forget()
    assert model.decoder.recorded == {}
    model.reset()
    model.forward([1, 2])
    assert list(model.decode_greedy(3, 5)) == before
    assert model.decoder.step(model.position) is not step


@pytest.mark.parametrize("position,context,bound", [
    (0, 24, 24), (0, 8192, 64), (63, 8192, 64), (64, 8192, 256), (255, 8192, 256),
    (256, 8192, 1024), (1023, 8192, 1024),
    (1024, 8192, 4096), (4096, 8192, 8192), (8191, 8192, 8192), (300, 300, 300)])
def test_step_bound_is_the_smallest_span_that_covers_the_position(position, context, bound):
    assert step_bound(position, context) == bound


@pytest.mark.parametrize("backend", ["cpu", "webgpu"])
@pytest.mark.parametrize("prompt_len,bounds", [(58, [64, 256]), (250, [256, 300])])
def test_greedy_decoding_across_step_bounds_matches_the_numpy_backend(prompt_len, bounds,
                                                                     backend, tmp_path, rng,
                                                                     request):
    # Context 300: positions below 64 take the step whose attention is one key range,
    # those below 256 the step whose four ranges the output projection merges, later
    # ones the step recorded for the whole context; a chained run crosses from one to
    # the next and must choose the tokens the numpy backend chooses token by token.
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=300), rng)
    prompt = rng.integers(0, 101, size=prompt_len).tolist()
    reference = load_model(str(path), backend="numpy", progress=False)
    first, expected = _greedy_token_by_token(reference, prompt, 12)
    model = load_model(str(path), backend=backend, progress=False)
    model.forward(prompt)
    assert list(model.decode_greedy(first, 12)) == expected
    recorded = model.decoder.recorded
    assert sorted(recorded) == bounds
    if backend == "webgpu":
        assert [recorded[b].dispatches for b in bounds] == [STEP_DISPATCHES] * 2


@pytest.mark.parametrize("backend", ["cpu", "webgpu"])
def test_sampled_decoding_draws_what_the_numpy_backend_draws_token_by_token(
        backend, tmp_path, rng, request):
    # A chained run at temperature 100 (the draws made on the device, the counter advanced
    # there, across the 64-key bound) against the numpy model fed one token at a time,
    # each drawn from its logits with the reference's noise for that position.
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=300), rng)
    prompt = rng.integers(0, 101, size=58).tolist()
    temperature, seed = 100.0, 4321  # the tiny model's logits are peaked
    cpu = load_model(str(path), backend="numpy", progress=False)
    draw = lambda logits, position: int(np.argmax(  # noqa: E731
        sampled_logits(logits, temperature, seed, position)))
    token = first = draw(cpu.forward(prompt), len(prompt) - 1)
    expected, argmaxes = [], []
    for _ in range(12):
        position = cpu.position
        logits = cpu.forward([token])
        token = draw(logits, position)
        expected.append(token)
        argmaxes.append(int(np.argmax(logits)))
    assert expected != argmaxes  # the draws are not simply greedy
    model = load_model(str(path), backend=backend, progress=False)
    model.forward(prompt)
    assert list(model.decode(first, 12, temperature, seed)) == expected
    assert model.position == len(prompt) + 12
