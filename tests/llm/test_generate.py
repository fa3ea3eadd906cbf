"""The generation loop on a scripted stand-in model (a LanguageModel, as pxvm.llm's
Model is): stopping rules, streaming, context limits and timing. The real model end to
end is tests/cli/test_llm_cli.py's job."""

from __future__ import annotations

import numpy as np
import pytest
from test_tokenizer import _smollm_tokenizer, smollm_metadata

from pxvm.llm.generate import PromptTooLongError, benchmark, device_seed, generate
from pxvm.llm.sampling import SamplingParams
from pxvm.ops.decoding import sampled_logits


class ScriptedModel:
    """Logits that make greedy decoding say `script` token by token; records every forward
    call. With `random_logits`, logits are seeded noise instead (for sampling tests).
    `decode` feeds forward one token at a time, drawing as the device's steps do."""

    backend_name = "fake"
    backend_reason = None
    context_reason = None
    device_name = "scripted test model"
    kv_cache = "f16"

    def __init__(self, metadata, script=(), context_length=8192, random_logits=False):
        vocab = len(metadata["tokenizer.ggml.tokens"])
        self.metadata = metadata
        self.vocab_size = vocab
        self.context_length = context_length
        self.script = list(script)
        self.random_logits = random_logits
        self.calls: list[list[int]] = []
        self.log: list[tuple[int, int]] = []  # (position, tokens) of every call, kept by reset
        self.returned: list[np.ndarray] = []  # the logits of every call since reset
        self.positions: list[int] = []        # and the position they were computed at
        self.position = 0

    def reset(self):
        self.position = 0
        self.calls.clear()
        self.returned.clear()
        self.positions.clear()

    def forward(self, token_ids):
        ids = [int(t) for t in token_ids]
        assert ids and self.position + len(ids) <= self.context_length
        self.calls.append(ids)
        self.log.append((self.position, len(ids)))
        self.position += len(ids)
        if self.random_logits:
            logits = np.random.default_rng(self.position).normal(
                0, 2, self.vocab_size).astype(np.float32)
        else:
            logits = np.zeros(self.vocab_size, np.float32)
            step = len(self.calls) - 1
            logits[self.script[min(step, len(self.script) - 1)]] = 10.0
        self.returned.append(logits)
        self.positions.append(self.position - 1)
        return logits

    def decode(self, token, n, temperature=0.0, seed=0):
        """Feed `token`, then each token drawn from the last logits: the argmax of
        sampled_logits with the logits' position as counter (the draw the device makes)."""
        for _ in range(n):
            counter = self.position
            logits = self.forward([token])
            token = int(np.argmax(sampled_logits(logits, temperature, seed, counter)))
            yield token


@pytest.fixture(scope="module")
def tok():
    return _smollm_tokenizer()


@pytest.fixture(scope="module")
def meta():
    return smollm_metadata()


def _eos(meta):
    return meta["tokenizer.ggml.eos_token_id"]


def test_stops_at_eos_and_streams_the_whole_text(tok, meta):
    words = tok.encode(" Paris is lovely — très belle 🗼!")
    model = ScriptedModel(meta, words + [_eos(meta)] + tok.encode(" never"))
    pieces = []
    result = generate(model, tok, "Tell me", max_tokens=100, stream=pieces.append)
    assert result.stop_reason == "eos"
    assert result.token_ids == words
    assert result.text == " Paris is lovely — très belle 🗼!"
    assert "".join(pieces) == result.text
    assert all(pieces)
    assert model.calls[0] == tok.encode("Tell me")
    assert len(model.calls) == 1 + len(words)


def test_max_tokens_limits_generation(tok, meta):
    script = tok.encode(" one two three four five six seven")
    model = ScriptedModel(meta, script)
    result = generate(model, tok, "Count:", max_tokens=4)
    assert result.stop_reason == "max_tokens"
    assert result.token_ids == script[:4]
    assert result.text == tok.decode(script[:4])
    # The prompt, then one forward per token except the last (its logits are not needed).
    assert len(model.calls) == 4 and result.decode_steps == 3


def test_zero_max_tokens_generates_nothing(tok, meta):
    result = generate(ScriptedModel(meta, tok.encode(" x")), tok, "Hi", max_tokens=0)
    assert result.text == "" and result.token_ids == []


def test_stop_string_cuts_the_text_and_is_never_streamed(tok, meta):
    reply = "The answer is 42.\nUser: and then?"
    model = ScriptedModel(meta, tok.encode(reply))
    pieces = []
    result = generate(model, tok, "Q:", max_tokens=50, stop=["\nUser:"], stream=pieces.append)
    assert result.stop_reason == "stop_string"
    assert result.text == "The answer is 42."
    assert "".join(pieces) == result.text


def test_chat_renders_the_template_and_stops_at_end_of_turn(tok, meta):
    im_end = tok.token_id("<|im_end|>")
    reply = tok.encode("The capital of France is Paris.")
    model = ScriptedModel(meta, reply + [im_end] + tok.encode("<|im_start|>user"))
    result = generate(model, tok, "What is the capital of France?", chat=True, max_tokens=50)
    assert result.text == "The capital of France is Paris."
    assert result.stop_reason == "eos"
    prompt_text = tok.decode(model.calls[0])
    assert prompt_text.endswith("<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
                                "<|im_start|>assistant\n")
    assert model.calls[0][0] == tok.token_id("<|im_start|>")


def test_multi_turn_messages_include_history(tok, meta):
    model = ScriptedModel(meta, tok.encode("Fine.") + [_eos(meta)])
    history = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "How are you?"}]
    generate(model, tok, messages=history, max_tokens=10)
    text = tok.decode(model.calls[0])
    assert text.index("Hi") < text.index("Hello!") < text.index("How are you?")


def test_prompt_longer_than_context_is_an_error(tok, meta):
    model = ScriptedModel(meta, [5], context_length=8)
    with pytest.raises(PromptTooLongError, match="context is 8"):
        generate(model, tok, "word " * 20, max_tokens=4)
    assert model.calls == []


def test_generation_stops_at_the_end_of_the_context(tok, meta):
    prompt = tok.encode("a b c d e")
    model = ScriptedModel(meta, tok.encode(" x y z w v u t s"), context_length=len(prompt) + 3)
    result = generate(model, tok, "a b c d e", max_tokens=20)
    assert result.stop_reason == "context"
    assert len(result.token_ids) == 3
    assert model.position <= model.context_length


def test_sampling_is_reproducible_for_a_seed(tok, meta):
    def run(seed):
        model = ScriptedModel(meta, random_logits=True)
        params = SamplingParams(temperature=1.0, top_k=40, top_p=0.9, seed=seed)
        return generate(model, tok, "Once", max_tokens=12, sampling=params).token_ids

    assert run(11) == run(11)
    assert run(11) != run(12)


def test_temperature_sampling_draws_from_each_positions_logits_with_the_seed(tok, meta):
    # Temperature alone: each token is the argmax of its logits / temperature plus the
    # Gumbel noise of (seed, position) (the draw the GPU makes in place), checked here
    # against the logits the scripted model returned.
    def run(seed):
        model = ScriptedModel(meta, random_logits=True)
        params = SamplingParams(temperature=0.8, seed=seed)
        result = generate(model, tok, "Once", max_tokens=12, sampling=params)
        return model, result.token_ids

    model, tokens = run(11)
    assert tokens == run(11)[1] and tokens != run(12)[1]
    seed = device_seed(11)
    for position, logits, token in zip(model.positions, model.returned, tokens):
        assert token == int(np.argmax(sampled_logits(logits, 0.8, seed, position)))
    assert any(token != int(np.argmax(logits)) for logits, token in zip(model.returned, tokens))


def test_timings_are_reported(tok, meta):
    model = ScriptedModel(meta, tok.encode(" a b c d"))
    result = generate(model, tok, "x y z", max_tokens=4)
    assert result.prompt_tokens == 3 and result.generated_tokens == 4
    assert result.prefill_s > 0 and result.decode_s > 0
    assert result.prompt_tokens_per_s > 0 and result.generation_tokens_per_s > 0


def test_benchmark_runs_the_requested_token_counts_from_an_empty_context(tok, meta):
    model = ScriptedModel(meta, [7])
    result = benchmark(model, tok, prompt_tokens=33, gen_tokens=5, repeats=2, warmup=1)
    # Each run: the prompt at position 0, then, after a reset, 5 single steps from 0.
    run = [(0, 33)] + [(i, 1) for i in range(5)]
    assert model.log == run * 3
    assert len(result["runs"]) == 2 and result["device"] == "scripted test model"
    assert result["depth"] == 0
    assert result["prefill_tokens_per_s"] > 0 and result["decode_tokens_per_s"] > 0
    with pytest.raises(PromptTooLongError):
        benchmark(ScriptedModel(meta, [7], context_length=16), tok, 17, 4)


def test_benchmark_depth_fills_the_context_before_each_measured_part(tok, meta):
    model = ScriptedModel(meta, [7], context_length=49)
    result = benchmark(model, tok, prompt_tokens=9, gen_tokens=3, repeats=1, warmup=0, depth=40)
    assert model.log == [(0, 40), (40, 9), (0, 40), (40, 1), (41, 1), (42, 1)]
    assert result["depth"] == 40
    with pytest.raises(PromptTooLongError, match="--depth"):
        benchmark(model, tok, prompt_tokens=9, gen_tokens=3, depth=41)
