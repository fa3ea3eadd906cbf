"""Continuous batching (pxvm.llm.engine) on tiny random GGUF files: what many sequences
generate together through the paged KV cache, joining and leaving mid-run, preempted
when blocks run out, sharing cached prefixes, must be what the single-sequence Model
(its own KV cache, attention_cached: an independent attention path) generates for each
alone; and the engine's contract with the server (cancel, the queue bound, seeds,
logits processors, logprobs, stop tokens, errors)."""

from __future__ import annotations

import logging
import threading

import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf
from test_families import CASES as FAMILY_CASES
from test_model import NMSE_MODEL

from pxvm.llm import load_model
from pxvm.llm.engine import (Engine, FinishEvent, QueueFullError, Request, RequestError,
                             TokenEvent)
from pxvm.llm.sampling import Sampler, SamplingParams

VOCAB = 101
#: Greedy with a repetition penalty: deterministic, and tiny random models, which repeat
#: one token under plain greedy decoding, then choose varied tokens.
PENALIZED = SamplingParams(repeat_penalty=1.8)
WAIT_S = 120  # a whole test's generation on the slowest backend takes seconds


class Collector:
    """Each request's events, and a wait until every request submitted has finished."""

    def __init__(self):
        self.events: dict[int, list] = {}
        self.lock = threading.Lock()
        self.finished = threading.Condition(self.lock)
        self.expected = 0

    def callback(self, key, then=None):
        """on_event for request `key`; then(events so far) runs after each event."""
        with self.lock:
            self.expected += 1
            self.events[key] = []

        def on_event(event):
            with self.lock:
                self.events[key].append(event)
                self.finished.notify_all()
            if then is not None:
                then(self.events[key])
        return on_event

    def wait(self):
        with self.lock:
            assert self.finished.wait_for(
                lambda: sum(isinstance(e[-1], FinishEvent) for e in self.events.values() if e)
                == self.expected, WAIT_S), "the engine did not finish every request"

    def tokens(self, key) -> list[int]:
        return [e.token_id for e in self.events[key] if isinstance(e, TokenEvent)]

    def finish(self, key) -> FinishEvent:
        (last,) = [e for e in self.events[key] if isinstance(e, FinishEvent)]
        assert self.events[key][-1] is last  # exactly one, the last
        return last


def join_later(engine, got, requests, index, after):
    """A `then` for Collector.callback: requests[index] submitted (as key `index`) from the
    engine's thread, mid-run, once the watched request has had `after` events."""
    def then(events):
        if len(events) == after:
            engine.submit(requests[index], got.callback(index))
    return then


def single_sequence(model, prompt, n, params=PENALIZED):
    """The tokens the Model alone chooses (fed one at a time through its own cache), with
    each step's logits."""
    sampler = Sampler(params)
    model.reset()
    logits = model.forward(prompt)
    tokens, all_logits = [], []
    for _ in range(n):
        all_logits.append(logits)
        tokens.append(sampler(logits, prompt + tokens))
        logits = model.forward([tokens[-1]])
    return tokens, all_logits


#: A step whose two best logits differ by less than this, relative to its largest, is a
#: near tie: the batched products (a GEMM on the CPU backend) and the single sequence's
#: (matrix-vector kernels) round differently, so either token is right there, and the
#: greedy sequences part (seen: 7e-5 on the CPU backend). Greedy comparisons stop there.
NEAR_TIE = 1e-3


def until_near_tie(logits) -> int:
    """How many of a single sequence's greedy tokens (chosen from `logits`, a step's
    each) come before its first near tie."""
    for i, step in enumerate(logits):
        second, first = np.sort(np.asarray(step, np.float64))[-2:]
        if first - second <= NEAR_TIE * np.abs(step).max():
            return i
    return len(logits)


def log_softmax(z):
    z = np.asarray(z, np.float64) - np.max(z)
    return z - np.log(np.exp(z).sum())


@pytest.fixture(params=["numpy", "cpu"])
def model(request, tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=64), rng)
    return load_model(str(path), backend=request.param, progress=False)


@pytest.fixture
def engines():
    """Engines made by the test, shut down after it."""
    made = []
    yield lambda *a, **k: made.append(Engine(*a, **k)) or made[-1]
    for engine in made:
        engine.shutdown()


def _prompts(rng, lengths):
    return [rng.integers(3, VOCAB, n).tolist() for n in lengths]


def test_batched_greedy_equals_single_sequence_for_sequences_joining_and_leaving(
        model, engines, rng):
    # lengths across block edges (blocks of 4), one prompt longer than a step's budget is
    # not needed here: test_long_prompts_are_chunked covers chunking
    prompts = _prompts(rng, [5, 17, 2, 33, 8, 12])
    lengths = [9, 4, 12, 6, 10, 3]
    expected = [single_sequence(model, p, n)[0] for p, n in zip(prompts, lengths)]
    engine = engines(model, block_size=4, kv_blocks=64, max_batch=4)
    got = Collector()

    requests = [Request(p, n, PENALIZED) for p, n in zip(prompts, lengths)]
    engine.submit(requests[0], got.callback(0, then=join_later(engine, got, requests, 3, 2)))
    engine.submit(requests[1], got.callback(1, then=join_later(engine, got, requests, 4, 3)))
    engine.submit(requests[2], got.callback(2, then=join_later(engine, got, requests, 5, 7)))
    engine.start()
    got.wait()
    for i, tokens in enumerate(expected):
        assert got.tokens(i) == tokens, f"request {i}"
        finish = got.finish(i)
        assert (finish.reason, finish.prompt_tokens, finish.completion_tokens) == (
            "length", len(prompts[i]), lengths[i])
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert stats.prompt_tokens_total == sum(map(len, prompts))
    assert stats.generated_tokens_total == sum(lengths)


def test_preempted_sequences_resume_with_the_same_tokens(model, engines, rng, caplog):
    # 3 sequences of up to 40 positions in 20 blocks of 4 (10 blocks each at the end):
    # all start, then the newest are preempted and computed again
    prompts = _prompts(rng, [10, 14, 7])
    n = 30
    expected = [single_sequence(model, p, n)[0] for p in prompts]
    engine = engines(model, block_size=4, kv_blocks=20, max_batch=3)
    got = Collector()
    for i, p in enumerate(prompts):
        engine.submit(Request(p, n, PENALIZED), got.callback(i))
    with caplog.at_level(logging.DEBUG, logger="pxvm.llm.engine"):
        engine.start()
        got.wait()
    assert any("preempting" in r.message for r in caplog.records)
    for i, tokens in enumerate(expected):
        assert got.tokens(i) == tokens, f"request {i}"
        assert got.finish(i).reason == "length"
    assert engine.stats().kv_blocks_used == 0


def test_long_prompts_are_chunked_between_decoding_steps(model, engines, rng, monkeypatch):
    from pxvm.llm import engine as engine_module
    monkeypatch.setattr(engine_module, "STEP_TOKENS", 8)  # a 40-token prompt takes 5 steps
    prompts = _prompts(rng, [3, 40])
    expected = [single_sequence(model, p, 10)[0] for p in prompts]
    engine = engines(model, block_size=4, kv_blocks=40)
    got = Collector()
    engine.submit(Request(prompts[0], 10, PENALIZED), got.callback(0))
    engine.submit(Request(prompts[1], 10, PENALIZED), got.callback(1))
    engine.start()
    got.wait()
    assert [got.tokens(0), got.tokens(1)] == expected


def test_logprobs_are_the_log_softmax_of_the_single_sequence_logits(model, engines, rng):
    (prompt,) = _prompts(rng, [11])
    tokens, logits = single_sequence(model, prompt, 6)
    engine = engines(model, block_size=4, kv_blocks=16)
    got = Collector()
    engine.submit(Request(prompt, 6, PENALIZED, logprobs=VOCAB), got.callback(0))
    engine.submit(Request(prompt[:5], 6, PENALIZED, logprobs=3), got.callback(1))
    engine.start()
    got.wait()
    events = [e for e in got.events[0] if isinstance(e, TokenEvent)]
    assert [e.token_id for e in events] == tokens
    for event, step_logits in zip(events, logits):
        expected = log_softmax(step_logits)
        ids, values = zip(*event.top_logprobs)
        assert sorted(ids) == list(range(VOCAB))
        assert list(values) == sorted(values, reverse=True)
        assert nmse(np.array(values), expected[list(ids)]) <= NMSE_MODEL
        # within what NMSE_MODEL allows (sqrt(1e-5): ~3e-3 relative); a token of
        # probability ~1 has a logprob of ~-1e-9, whose relative error float32 logits
        # cannot bound: there, an absolute 1e-6
        assert event.logprob == pytest.approx(expected[event.token_id], rel=3e-3, abs=1e-6)
    assert all(len(e.top_logprobs) == 3 for e in got.events[1] if isinstance(e, TokenEvent))


def test_prefix_cache_hits_give_the_same_tokens_and_report_cached_tokens(model, engines, rng):
    (shared,) = _prompts(rng, [10])
    repeated = shared + [7]                 # 11 tokens: 2 full blocks of 4 are cached
    branch = shared[:6] + [9, 9, 9]         # shares the first block only
    engine = engines(model, block_size=4, kv_blocks=32)
    engine.start()
    results = {}
    for key, prompt in (("first", repeated), ("again", repeated), ("branch", branch),
                        ("exact", repeated[:8])):
        got = Collector()
        engine.submit(Request(prompt, 8, PENALIZED), got.callback(key))
        got.wait()
        results[key] = (got.tokens(key), got.finish(key).cached_tokens)
    assert results["first"][1] == 0
    assert results["again"] == (single_sequence(model, repeated, 8)[0], 8)
    assert results["branch"] == (single_sequence(model, branch, 8)[0], 4)
    # a prompt of whole cached blocks computes its last block again (its last token's
    # logits are needed): one block of 4 is served from the cache
    assert results["exact"] == (single_sequence(model, repeated[:8], 8)[0], 4)
    assert engine.stats().kv_blocks_used == 0


def test_cancel_frees_the_blocks_at_once_and_finishes_cancelled(model, engines, rng):
    prompts = _prompts(rng, [9, 6])
    engine = engines(model, block_size=4, kv_blocks=30)
    got = Collector()
    cancelled_at = {}

    def cancel_after_two(events):
        if len(events) == 2:
            engine.cancel(ids[0])
            cancelled_at["used"] = engine.stats().kv_blocks_used

    ids = [engine.submit(Request(prompts[0], 40, PENALIZED), got.callback(0, cancel_after_two)),
           engine.submit(Request(prompts[1], 20, PENALIZED), got.callback(1))]
    waiting = engine.submit(Request(prompts[1], 5, PENALIZED), got.callback(2))
    engine.cancel(waiting)  # cancelled before it ever ran
    engine.start()
    got.wait()
    finish = got.finish(0)
    assert (finish.reason, finish.completion_tokens) == ("cancelled", 2)
    assert got.finish(2).reason == "cancelled" and got.tokens(2) == []
    assert got.finish(1).reason == "length"
    # request 1 (6 + up to 2 tokens: 2 or 3 blocks of 4) is all that held blocks then
    assert cancelled_at["used"] <= 3
    assert engine.stats().kv_blocks_used == 0
    engine.cancel(ids[0])  # already finished: nothing, no second FinishEvent
    assert len([e for e in got.events[0] if isinstance(e, FinishEvent)]) == 1


def test_seeded_sampling_draws_the_same_tokens_whatever_runs_beside_it(model, engines, rng):
    prompts = _prompts(rng, [7, 12, 4, 9])
    # hot enough to draw varied tokens from the tiny models' peaked logits; no top-k or
    # top-p: at this heat many tokens are near ties, which the batched products (rounded
    # unlike a single sequence's) may order otherwise, changing the set drawn from
    seeded = SamplingParams(temperature=50.0, seed=1234)
    runs = []
    for companions in (0, 3):
        engine = engines(model, block_size=4, kv_blocks=48)
        got = Collector()
        engine.submit(Request(prompts[0], 12, seeded), got.callback("seeded"))
        for i in range(companions):
            engine.submit(Request(prompts[1 + i], 12, SamplingParams(temperature=1.0)),
                          got.callback(i))
        engine.start()
        got.wait()
        runs.append(got.tokens("seeded"))
    assert runs[0] == runs[1]
    assert len(set(runs[0])) > 1  # sampled, not one repeated token


def test_logits_processor_masks_are_honoured(model, engines, rng):
    (prompt,) = _prompts(rng, [6])
    seen = []

    def even_only(generated, logits):
        seen.append(list(generated))
        out = np.full_like(logits, -np.inf)
        out[0::2] = logits[0::2]
        return out

    engine = engines(model, block_size=4, kv_blocks=16)
    got = Collector()
    engine.submit(Request(prompt, 10, SamplingParams(temperature=10.0, seed=5),
                          logits_processor=even_only), got.callback(0))
    engine.start()
    got.wait()
    tokens = got.tokens(0)
    assert len(tokens) == 10 and all(t % 2 == 0 for t in tokens)
    assert seen == [tokens[:i] for i in range(10)]  # the tokens generated so far


def test_a_stop_token_ends_the_request_and_is_not_sent(model, engines, rng):
    (prompt,) = _prompts(rng, [8])
    tokens, _ = single_sequence(model, prompt, 10)
    stop = tokens[4]
    engine = engines(model, block_size=4, kv_blocks=16)
    got = Collector()
    engine.submit(Request(prompt, 10, PENALIZED, stop_token_ids=frozenset({stop})),
                  got.callback(0))
    engine.start()
    got.wait()
    sent = tokens[:tokens.index(stop)]
    assert got.tokens(0) == sent
    finish = got.finish(0)
    assert (finish.reason, finish.completion_tokens) == ("stop", len(sent))


def test_the_waiting_queue_is_bounded(model, engines, rng):
    engine = engines(model, block_size=4, kv_blocks=16, max_waiting=2)
    got = Collector()
    prompt = _prompts(rng, [3])[0]
    for i in range(2):
        engine.submit(Request(prompt, 2), got.callback(i))
    with pytest.raises(QueueFullError, match="max_waiting=2"):
        engine.submit(Request(prompt, 2), lambda event: None)
    engine.shutdown()  # never started: every open request is cancelled
    assert [got.finish(i).reason for i in range(2)] == ["cancelled", "cancelled"]
    with pytest.raises(QueueFullError, match="shutting down"):
        engine.submit(Request(prompt, 2), lambda event: None)


def test_alive_is_whether_the_engines_thread_runs(model, engines):
    engine = engines(model, block_size=4, kv_blocks=16)
    assert not engine.alive  # not started
    engine.start()
    assert engine.alive
    engine.shutdown()
    assert not engine.alive


def test_a_request_larger_than_the_whole_cache_finishes_with_an_error(model, engines, rng):
    engine = engines(model, block_size=4, kv_blocks=4)  # 16 positions
    got = Collector()
    prompts = _prompts(rng, [10, 5])
    engine.submit(Request(prompts[0], 10), got.callback(0))
    engine.submit(Request(prompts[1], 4), got.callback(1))
    engine.start()
    got.wait()
    finish = got.finish(0)
    assert finish.reason == "error" and "kv_blocks" in finish.error
    assert got.finish(1).reason == "length" and len(got.tokens(1)) == 4


@pytest.mark.parametrize("prompt,max_tokens,match", [
    ([], 4, "no tokens"), ([1, VOCAB], 4, "0..100"), ([1, -1], 4, "0..100"),
    ([1, 2], 0, "max_tokens"), ([1] * 60, 5, "context of 64")])
def test_bad_requests_raise_request_error(model, engines, prompt, max_tokens, match):
    engine = engines(model, kv_blocks=8)
    with pytest.raises(RequestError, match=match):
        engine.submit(Request(prompt, max_tokens), lambda event: None)


@pytest.mark.parametrize("family", list(FAMILY_CASES))
def test_every_family_generates_batched_as_the_single_sequence_model(family, engines,
                                                                    tmp_path, rng):
    # soft-caps, sliding windows (shorter than the sequences), QK norm, post-norms, QKV
    # biases, fused QKV and gate-up, RoPE variants: attention_paged takes the layer's
    # attention_cached parameters
    case = FAMILY_CASES[family]
    write_tiny_gguf(tmp_path / "model.gguf", case.spec, rng)
    model = load_model(str(tmp_path / "model.gguf"), backend="numpy", progress=False,
                       max_context=case.max_context)
    prompts = [rng.integers(3, case.spec.vocab_size, n).tolist() for n in (9, 14, 5)]
    expected = [single_sequence(model, p, 6) for p in prompts]
    engine = engines(model, block_size=4, kv_blocks=24)
    got = Collector()
    for i, p in enumerate(prompts):
        engine.submit(Request(p, 6, PENALIZED, logprobs=case.spec.vocab_size), got.callback(i))
    engine.start()
    got.wait()
    for i, (tokens, logits) in enumerate(expected):
        assert got.tokens(i) == tokens, f"request {i}"
        for event, step_logits in zip(got.events[i], logits):
            ids, values = zip(*event.top_logprobs)
            assert nmse(np.array(values), log_softmax(step_logits)[list(ids)]) <= NMSE_MODEL


def test_many_requests_with_cancels_under_preemption_finish_once_and_leak_no_block(
        model, engines, rng):
    _cancels_under_preemption(model, engines, rng, PENALIZED)


def test_greedy_requests_chained_with_cancels_under_preemption_finish_once_and_leak_no_block(
        untied_model, engines, rng):
    # the same with the steps chained on the device (plain greedy)
    _cancels_under_preemption(untied_model, engines, rng, SamplingParams())


def _cancels_under_preemption(model, engines, rng, params):
    # 30 requests through 16 blocks of 4 (64 positions; a request takes up to 44), 6 at
    # a time, a third of them cancelled from another thread while they wait or run
    lengths = rng.integers(1, 25, 30).tolist()
    max_tokens = rng.integers(1, 21, 30).tolist()
    prompts = _prompts(rng, lengths)
    engine = engines(model, block_size=4, kv_blocks=16, max_batch=6)
    got = Collector()
    ids = [engine.submit(Request(p, n, params), got.callback(i))
           for i, (p, n) in enumerate(zip(prompts, max_tokens))]
    engine.start()
    for i in rng.permutation(30)[:10]:
        engine.cancel(ids[i])
        threading.Event().wait(float(rng.uniform(0, 0.02)))
    got.wait()
    for i in range(30):
        finish = got.finish(i)
        assert finish.completion_tokens == len(got.tokens(i))
        if finish.reason == "length":
            expected, logits = single_sequence(model, prompts[i], max_tokens[i], params)
            n = until_near_tie(logits) if params == SamplingParams() else len(expected)
            assert got.tokens(i)[:n] == expected[:n], f"request {i}"
        else:
            assert finish.reason == "cancelled"
    stats = engine.stats()
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)


def _batched_equals_single_sequence(backend, engines, tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=64), rng)
    model = load_model(str(path), backend=backend, progress=False)
    prompts = _prompts(rng, [5, 17, 2])
    expected = [single_sequence(model, p, 8)[0] for p in prompts]
    engine = engines(model, block_size=4, kv_blocks=24)
    got = Collector()
    for i, p in enumerate(prompts):
        engine.submit(Request(p, 8, PENALIZED), got.callback(i))
    engine.start()  # its own thread, which runs the backend's work from then on
    got.wait()
    assert [got.tokens(i) for i in range(3)] == expected
    assert engine.stats().kv_blocks_used == 0


def test_webgpu_generates_batched_as_the_single_sequence_model(gpu_device, engines, tmp_path,
                                                               rng):
    _batched_equals_single_sequence("webgpu", engines, tmp_path, rng)


def test_cuda_generates_batched_as_the_single_sequence_model(cuda_device, engines, tmp_path,
                                                             rng):
    _batched_equals_single_sequence("cuda", engines, tmp_path, rng)


@pytest.fixture(params=["numpy", "cpu", "webgpu", "cuda"])
def untied_model(request, tmp_path, rng):
    """A model whose plain greedy tokens vary (a tied one repeats its first)."""
    if request.param in ("webgpu", "cuda"):
        request.getfixturevalue({"webgpu": "gpu_device", "cuda": "cuda_device"}[request.param])
    path = tmp_path / "untied.gguf"
    write_tiny_gguf(path, TinySpec(context_length=64, tied_output=False), rng)
    return load_model(str(path), backend=request.param, progress=False)


def test_greedy_steps_chained_on_the_device_equal_single_sequences_joining_and_leaving(
        untied_model, engines, rng):
    # plain greedy: each step's tokens stay on the device, where the next step starts
    # from them (PagedSteps.chain) while the host reads them; requests join mid-run (the
    # chain breaks for them), stop at a stop token or their length, cross block edges
    model = untied_model
    prompts = _prompts(rng, [5, 17, 2, 9, 3])
    lengths = [19, 11, 23, 7, 14]
    greedy = SamplingParams()
    expected = [single_sequence(model, p, n, greedy) for p, n in zip(prompts, lengths)]
    stop = expected[2][0][15]
    engine = engines(model, block_size=4, kv_blocks=64, max_batch=4)
    assert engine.steps.chains
    got = Collector()

    requests = [Request(p, n, greedy) for p, n in zip(prompts, lengths)]
    requests[2] = Request(prompts[2], lengths[2], greedy, stop_token_ids=frozenset({stop}))
    engine.submit(requests[0], got.callback(0, then=join_later(engine, got, requests, 3, 5)))
    engine.submit(requests[1], got.callback(1, then=join_later(engine, got, requests, 4, 9)))
    engine.submit(requests[2], got.callback(2))
    engine.start()
    got.wait()
    compared = 0
    for i, (tokens, logits) in enumerate(expected):
        n = until_near_tie(logits)
        if i == 2 and n > tokens.index(stop):  # the stop token comes before any near tie
            n = tokens.index(stop)
            assert got.tokens(i) == tokens[:n] and got.finish(i).reason == "stop"
        assert got.tokens(i)[:n] == tokens[:n], f"request {i}"
        assert i == 2 or got.finish(i).reason == "length"
        compared += n
    assert compared >= 20  # most tokens are compared, whatever the near ties
    assert engine.stats().kv_blocks_used == 0
