"""Fuzzing tokenizers and chat templates from mutated metadata: every case builds (or
renders) or ends in one clear PxvmError, in the bounded worker (30 s, 1.5 GB).

CI runs PXVM_FUZZ_EXAMPLES cases (default 40); the long run is
`PXVM_FUZZ_EXAMPLES=10000 python3 -m pytest -q tests/fuzz/test_fuzz_tokenizer.py`."""

from __future__ import annotations

import math

from harness import FUZZ, assert_clear, fuzz_worker  # noqa: F401 - the fixture
from hypothesis import given
from hypothesis import strategies as st
from tokenizer_target import build_and_encode, render

KIND = "tokenizer"

TOKENS = ["<unk>", "<s>", "</s>", "<|im_start|>", "▁", "a", "b", "ab", "▁a", "▁b", "h", "i",
          "hi", "▁hi", "\n", "Ġ", "Ġb", "Ċ", "<0x0A>", "<0x1B>", "\x1b[2J"]
HOSTILE = [None, 0, -1, 1, 2**31, 2**64 - 1, True, 1.5, math.nan, "x", "", [], [1, "a"],
           "a" * 5000, ["a"] * 3]

FIELDS = ["model", "tokens", "scores", "token_type", "merges", "pre", "bos_token_id",
          "eos_token_id", "unknown_token_id", "eot_token_id", "add_bos_token",
          "add_space_prefix"]


def _seed(kind: str) -> dict:
    n = len(TOKENS)
    meta = {"tokenizer.ggml.model": kind, "tokenizer.ggml.tokens": list(TOKENS),
            "tokenizer.ggml.scores": [-float(len(t)) for t in TOKENS],
            "tokenizer.ggml.token_type": [2, 3, 3, 3] + [1] * (n - 4),
            "tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
            "tokenizer.ggml.unknown_token_id": 0}
    if kind == "gpt2":
        meta["tokenizer.ggml.merges"] = ["a b", "h i", "Ġ b"]
        meta["tokenizer.ggml.pre"] = "default"
    return meta


@st.composite
def mutated_metadata(draw) -> dict:
    meta = _seed(draw(st.sampled_from(["llama", "gpt2"])))
    for _ in range(draw(st.integers(1, 3))):
        key = "tokenizer.ggml." + draw(st.sampled_from(FIELDS))
        value = meta.get(key)
        if isinstance(value, list) and value and draw(st.booleans()):
            value = list(value)
            i = draw(st.integers(0, len(value) - 1))
            how = draw(st.sampled_from(["set", "drop", "grow"]))
            if how == "set":
                value[i] = draw(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=8)))
            elif how == "drop":
                del value[i]
            else:
                value.append(draw(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=8))))
        else:
            value = draw(st.one_of(st.sampled_from(HOSTILE), st.text(max_size=12)))
        meta[key] = value
    return meta


#: Pieces of Jinja, real and hostile, that templates are put together from.
PIECES = ["{% for m in messages %}", "{% endfor %}", "{{ m.content }}", "{{ m['role'] }}",
          "{% if add_generation_prompt %}", "{% endif %}", "{{ bos_token }}",
          "{% for i in range(100000) %}", "{{ 'a' * 3000000 }}", "{{ 'a' * 300 }}",
          "{{ lipsum(1000) }}", "{{ messages|tojson(indent=2) }}", "{{ x|center(99999) }}",
          "{{ 1 // 0 }}", "{% macro f(n) %}{{ f(n) }}{{ f(n) }}{% endmacro %}", "{{ f(3) }}",
          "{% set ns = namespace(s='ab') %}", "{% set ns.s = ns.s ~ ns.s %}", "{{ ns.s }}",
          "{{ raise_exception('no') }}", "{{ '%099d' % 1 }}", "{{ 10 ** 1000 }}",
          "{{ ''.__class__ }}", "{% set x %}", "{% endset %}", "{{ x }}", "{% break %}",
          "{{ range(10)|batch(3)|list }}", "{{ (messages * 1000)|join(',') }}", "{{", "}}",
          "{%", "%}", "text\n"]


@st.composite
def mutated_template(draw):
    if draw(st.integers(0, 19)) == 0:
        return draw(st.sampled_from([5, ["{{ x }}"], b"{{ x }}", None]))
    return "".join(draw(st.lists(st.sampled_from(PIECES), min_size=1, max_size=12)))


MESSAGES = [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "a b"}]


@FUZZ
@given(metadata=mutated_metadata())
def test_fuzz_tokenizer_metadata(fuzz_worker, metadata):
    assert_clear(fuzz_worker.run(build_and_encode, metadata))


@FUZZ
@given(template=mutated_template())
def test_fuzz_chat_template(fuzz_worker, template):
    assert_clear(fuzz_worker.run(render, template, MESSAGES))
