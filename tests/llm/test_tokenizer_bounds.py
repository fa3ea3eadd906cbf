"""A model file's tokenizer fields are checked before anything is built: types, lengths,
id ranges, merges naming real tokens, and the vocabulary's size; each problem is one
TokenizerFileError (a ModelFileError) naming the field."""

from __future__ import annotations

import time

import pytest

from pxvm.llm import ModelFileError
from pxvm.llm.tokenizer import MAX_TOKEN_BYTES, Tokenizer, TokenizerFileError

TOKENS = ["<unk>", "<s>", "</s>", "▁", "a", "b", "ab", "▁ab", "<0x1B>"]


def _sentencepiece(**changes) -> dict:
    meta = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": list(TOKENS),
            "tokenizer.ggml.scores": [0.0, 0.0, 0.0, -1.0, -2.0, -3.0, -4.0, -5.0, 0.0],
            "tokenizer.ggml.token_type": [2, 3, 3, 1, 1, 1, 1, 1, 6],
            "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.bos_token_id": 1,
            "tokenizer.ggml.eos_token_id": 2}
    meta.update({f"tokenizer.ggml.{k}": v for k, v in changes.items()})
    return meta


def _byte_level(**changes) -> dict:
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": ["a", "b", "ab", "c"],
            "tokenizer.ggml.merges": ["a b"]}
    meta.update({f"tokenizer.ggml.{k}": v for k, v in changes.items()})
    return meta


def test_a_valid_small_vocabulary_builds_and_spells():
    tok = Tokenizer(_sentencepiece(), source="m.gguf")
    assert tok.encode("ab", add_bos=False) == [TOKENS.index("▁ab")]
    assert Tokenizer(_byte_level()).encode("ab") == [2]


@pytest.mark.parametrize("field,value,match", [
    ("tokens", "abc", "'tokenizer.ggml.tokens' is str; it must be an array of strings"),
    ("tokens", [*TOKENS[:3], 7], "'tokenizer.ggml.tokens' holds int at 3"),
    ("scores", [0.0] * 3, "'tokenizer.ggml.scores' has 3 values for 9 tokens"),
    ("scores", [0.0] * 8 + [float("nan")], "'tokenizer.ggml.scores' holds values that are not"),
    ("scores", [0.0] * 8 + ["x"], "'tokenizer.ggml.scores' holds str at 8"),
    ("token_type", [1] * 8 + [9], "'tokenizer.ggml.token_type' is 9 at 8"),
    ("token_type", [1] * 8 + [True], "'tokenizer.ggml.token_type' holds bool at 8"),
    ("unknown_token_id", 99, "'tokenizer.ggml.unknown_token_id' is 99; it must be a token id"),
    ("bos_token_id", -1, "'tokenizer.ggml.bos_token_id' is -1"),
    ("eos_token_id", "2", "'tokenizer.ggml.eos_token_id' is '2'"),
    ("eot_token_id", 2.0, "'tokenizer.ggml.eot_token_id' is 2.0"),
    ("add_bos_token", 3, "'tokenizer.ggml.add_bos_token' is 3; it must be true or false"),
    ("pre", ["llama3"], "'tokenizer.ggml.pre' is list; it must be text"),
    ("model", 5, "'tokenizer.ggml.model' is int"),
])
def test_bad_sentencepiece_fields_are_named(field, value, match):
    with pytest.raises(TokenizerFileError, match=match) as caught:
        Tokenizer(_sentencepiece(**{field: value}), source="bad.gguf")
    assert isinstance(caught.value, ModelFileError) and "bad.gguf" in str(caught.value)


@pytest.mark.parametrize("merges,match", [
    (["ab"], "'tokenizer.ggml.merges' holds 'ab' at 0, which is not two tokens"),
    (["a q"], "'tokenizer.ggml.merges' names a token the vocabulary lacks.*q"),
    (["a c"], "'tokenizer.ggml.merges' names a token the vocabulary lacks.*ac"),
    ([1], "'tokenizer.ggml.merges' holds int at 0"),
])
def test_broken_merges_are_named(merges, match):
    with pytest.raises(TokenizerFileError, match=match):
        Tokenizer(_byte_level(merges=merges), source="bad.gguf")


def test_a_huge_token_is_refused_before_building():
    t0 = time.monotonic()
    with pytest.raises(TokenizerFileError, match=f"1,048,576 bytes at 9, over the bound of "
                                                 f"{MAX_TOKEN_BYTES:,}"):
        Tokenizer(_sentencepiece(tokens=[*TOKENS, "a" * (1 << 20)], scores=[0.0] * 10,
                                 token_type=[1] * 10))
    assert time.monotonic() - t0 < 1.0


def test_a_vocabulary_past_the_total_bound_is_refused():
    tokens = ["<unk>"] + [f"{i:0512d}" for i in range(40_000)]  # 20 MB of text
    with pytest.raises(TokenizerFileError, match="bytes of text, over the bound"):
        Tokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens})


def test_a_vocabulary_making_too_many_merges_is_refused_quickly():
    # runs of one letter: every cut of every run is a merge, ~n^2/2 of them per letter
    tokens = ["<unk>"] + [c * k for c in "abcdefgh" for k in range(1, 1025)]
    t0 = time.monotonic()
    with pytest.raises(TokenizerFileError, match="makes more than"):
        Tokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                   "tokenizer.ggml.scores": [-float(len(t)) for t in tokens]})
    assert time.monotonic() - t0 < 10


def test_derived_merges_rank_by_the_merged_tokens_score():
    # "abc" can come from "ab"+"c" or "a"+"bc": the better-scored "bc" forms first,
    # so SentencePiece spells "abc" as a+bc, not ab+c, when "abc" itself is absent
    tokens = ["<unk>", "▁", "a", "b", "c", "ab", "bc", "▁a"]
    scores = [0.0, -1.0, -2.0, -2.0, -2.0, -9.0, -3.0, -1.5]
    tok = Tokenizer({"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": tokens,
                     "tokenizer.ggml.scores": scores, "tokenizer.ggml.unknown_token_id": 0,
                     "tokenizer.ggml.token_type": [2] + [1] * 7})
    assert [tokens[i] for i in tok.encode("abc", add_bos=False)] == ["▁a", "bc"]
