"""The OpenAI API of `pxvm serve --model`, through the official `openai` client against a
live server on a tiny model: chat and completions, streamed and whole, stop strings, n,
seeds, logprobs (against the model's own logits), JSON schemas, usage."""

from __future__ import annotations

import json

import httpx
import jsonschema
import numpy as np
import pytest
from openai import OpenAI
from serving import server, tiny_model  # noqa: F401 - fixtures

from pxvm.llm import load_model
from pxvm.llm.generate import chat_prompt
from pxvm.llm.tokenizer import Tokenizer

MESSAGES = [{"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Say hello to the world."}]


@pytest.fixture(scope="module")
def client(server):  # noqa: F811
    return OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=60)


@pytest.fixture(scope="module")
def tokenizer(server):  # noqa: F811
    return Tokenizer(server.service.engine.model.metadata)


def _chat_ids(tokenizer, metadata, messages):
    return tokenizer.encode(chat_prompt(tokenizer, metadata, messages))


def test_chat_completion_answers_with_the_assistant_message_and_counts_usage(
        client, server, tokenizer):  # noqa: F811
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=7,
                                       temperature=0, extra_body={"ignore_eos": True})
    assert r.object == "chat.completion" and len(r.choices) == 1
    choice = r.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason == "length"
    prompt = _chat_ids(tokenizer, server.service.engine.model.metadata, MESSAGES)
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == 7
    assert r.usage.total_tokens == len(prompt) + 7
    assert 0 <= r.usage.prompt_tokens_details.cached_tokens < len(prompt)


def test_streamed_chat_concatenates_to_the_whole_answer(client):
    kwargs = dict(model="tiny", messages=MESSAGES, max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    whole = client.chat.completions.create(**kwargs).choices[0].message.content
    chunks = list(client.chat.completions.create(stream=True, **kwargs))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == whole
    assert chunks[-1].choices[0].finish_reason == "length"
    assert all(c.usage is None for c in chunks)


def test_a_stream_ends_with_done_and_a_usage_chunk_only_when_asked(server):  # noqa: F811
    body = {"prompt": "the", "max_tokens": 4, "stream": True, "ignore_eos": True}
    for include, usage_chunks in ((False, 0), (True, 1)):
        with httpx.stream("POST", server.url + "/v1/completions", timeout=60,
                          json={**body, "stream_options": {"include_usage": include}}) as r:
            assert r.status_code == 200
            assert r.headers["content-type"].startswith("text/event-stream")
            events = [line for line in r.iter_lines() if line]
        assert events[-1] == "data: [DONE]"
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        with_usage = [c for c in chunks if c.get("usage")]
        assert len(with_usage) == usage_chunks
        if include:
            assert with_usage[0] is chunks[-1] and with_usage[0]["choices"] == []
            assert with_usage[0]["usage"]["completion_tokens"] == 4


def test_completions_take_texts_lists_of_texts_and_token_ids(client, tokenizer):
    text = "the world"
    common = dict(model="tiny", max_tokens=6, temperature=0, extra_body={"ignore_eos": True})
    single = client.completions.create(prompt=text, **common)
    ids = client.completions.create(prompt=tokenizer.encode(text), **common)
    assert ids.choices[0].text == single.choices[0].text
    many = client.completions.create(prompt=[text, "hello"], n=2, **common)
    assert [c.index for c in many.choices] == [0, 1, 2, 3]
    assert many.choices[0].text == many.choices[1].text == single.choices[0].text
    lists = client.completions.create(prompt=[tokenizer.encode(text), tokenizer.encode("hello")],
                                      **common)
    assert [c.text for c in lists.choices] == [many.choices[0].text, many.choices[2].text]
    assert many.usage.prompt_tokens == len(tokenizer.encode(text)) + len(tokenizer.encode("hello"))
    assert many.usage.completion_tokens == 4 * 6


def test_a_seed_reproduces_sampled_text_and_each_of_n_choices_draws_its_own(client):
    kwargs = dict(model="tiny", prompt="hello", max_tokens=32, temperature=2.0, seed=1234,
                  n=3, extra_body={"ignore_eos": True})
    first = [c.text for c in client.completions.create(**kwargs).choices]
    again = [c.text for c in client.completions.create(**kwargs).choices]
    assert first == again
    # the tiny model's logits are peaked, and its stray bytes all print as U+FFFD: two
    # choices may read alike, but three seeds drawing the same 32 tokens would be a bug
    assert len(set(first)) >= 2


@pytest.mark.parametrize("stream", [False, True])
def test_a_stop_string_cuts_the_text_before_it(client, stream):
    kwargs = dict(model="tiny", prompt="hello", max_tokens=24, temperature=2.0, seed=0,
                  extra_body={"ignore_eos": True})
    full = client.completions.create(**kwargs).choices[0].text
    # a stop string of two printable characters from within the seeded text (the tiny
    # model repeats itself: a change of character is where its first match is known)
    at = next(i for i in range(2, len(full) - 1)
              if full[i] != full[i + 1] and full[i:i + 2].isprintable() and "\ufffd" not in full[i:i + 2])
    stop = full[at:at + 2]
    expected = full[:full.find(stop)]
    assert expected
    if stream:
        chunks = list(client.completions.create(stop=[stop, "never there"], stream=True, **kwargs))
        text = "".join(c.choices[0].text for c in chunks)
        reason = chunks[-1].choices[0].finish_reason
    else:
        r = client.completions.create(stop=stop, **kwargs)
        text, reason = r.choices[0].text, r.choices[0].finish_reason
    assert text == expected and reason == "stop"


def test_chat_logprobs_are_the_models_log_softmax(client, server, tokenizer):  # noqa: F811
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=3,
                                       temperature=0, logprobs=True, top_logprobs=3,
                                       extra_body={"ignore_eos": True})
    content = r.choices[0].logprobs.content
    assert len(content) == 3
    # the first token's logprobs from an independent forward of the prompt, in float64
    model = load_model(str(server.service.source), backend="numpy", progress=False)
    ids = _chat_ids(tokenizer, model.metadata, MESSAGES)
    z = model.forward(ids).astype(np.float64)
    logp = z - z.max() - np.log(np.exp(z - z.max()).sum())
    best = np.argsort(-logp)[:3]
    first = content[0]
    assert first.token == tokenizer.decode([int(best[0])])
    np.testing.assert_allclose(first.logprob, logp[best[0]], atol=1e-4)
    np.testing.assert_allclose([t.logprob for t in first.top_logprobs], logp[best], atol=1e-4)
    for entry in content:
        tops = [t.logprob for t in entry.top_logprobs]
        assert len(tops) == 3 and tops == sorted(tops, reverse=True)
        assert entry.logprob == pytest.approx(tops[0])  # greedy: the chosen is the best


def test_completion_logprobs_list_tokens_and_their_top_alternatives(client):
    r = client.completions.create(model="tiny", prompt="hello", max_tokens=4, temperature=0,
                                  logprobs=2, extra_body={"ignore_eos": True})
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.text_offset) == 4
    assert all(p <= 0 for p in lp.token_logprobs)
    assert all(1 <= len(top) <= 2 for top in lp.top_logprobs)
    assert lp.text_offset[0] == 0


SCHEMA = {"type": "object",
          "properties": {"ok": {"type": "boolean"},
                         "color": {"enum": ["red", "green", "blue"]},
                         "count": {"type": "integer", "minimum": 0, "maximum": 9}},
          "required": ["ok", "color", "count"], "additionalProperties": False}


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_json_schema_output_parses_and_validates(client, seed):
    r = client.chat.completions.create(
        model="tiny", messages=MESSAGES, max_tokens=64, temperature=1.0, seed=seed,
        response_format={"type": "json_schema",
                         "json_schema": {"name": "answer", "schema": SCHEMA}})
    assert r.choices[0].finish_reason == "stop"
    jsonschema.validate(json.loads(r.choices[0].message.content), SCHEMA)


def test_json_object_output_is_a_json_object(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=150,
                                       temperature=0, response_format={"type": "json_object"})
    assert r.choices[0].finish_reason == "stop"
    assert isinstance(json.loads(r.choices[0].message.content), dict)


def test_models_lists_the_served_model(client, server):  # noqa: F811
    models = client.models.list().data
    assert [m.id for m in models] == ["tiny-chat.gguf"]


def test_metrics_count_tokens_and_time_the_first_token(client, server):  # noqa: F811
    client.completions.create(model="tiny", prompt="hello", max_tokens=5, temperature=0,
                              extra_body={"ignore_eos": True})
    text = httpx.get(server.url + "/metrics").text
    values = {line.split(" ")[0]: float(line.split(" ")[1]) for line in text.splitlines()
              if line and not line.startswith("#")}
    stats = server.service.engine.stats()
    assert values["pxvm_generation_tokens_total"] == stats.generated_tokens_total >= 5
    assert values["pxvm_prompt_tokens_total"] == stats.prompt_tokens_total
    assert values["pxvm_requests_running"] == 0 and values["pxvm_kv_blocks_used"] == 0
    assert values["pxvm_kv_blocks_total"] == stats.kv_blocks_total > 0
    assert values["pxvm_time_to_first_token_seconds_count"] >= 1
    assert values["pxvm_inter_token_latency_seconds_count"] >= 4
