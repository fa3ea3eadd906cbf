"""Tokenizer built from a GGUF file's own vocabulary: byte-level BPE (GPT-2, SmolLM2, Qwen2/2.5/3,
Llama 3, Mistral Nemo style, `tokenizer.ggml.model == "gpt2"`) and SentencePiece BPE with byte
fallback (Llama 2, Mistral 7B, Phi-3, Gemma 2/3 style, `"llama"`), both run by the `tokenizers`
library; plus a streaming decoder that yields text as tokens arrive without splitting UTF-8
characters.

The rules follow llama.cpp's reading of the same metadata (llama-vocab.cpp), since that is what
writes and runs these files:

* `tokenizer.ggml.pre` picks the regex that cuts text into words before byte-level BPE; a name
  llama.cpp does not know is an error there and here (a wrong split silently changes the ids).
  Llama-3-style splits (and Mistral's "tekken") also take a word that is itself a token whole,
  before any merge (llama.cpp's `ignore_merges`, the `"ignore_merges": true` of Llama 3's own
  tokenizer.json).
* SentencePiece text gets a leading "▁" when `tokenizer.ggml.add_space_prefix` says so (the
  default; Gemma's files say false), at the start and after every token matched whole.
* BOS is added when `tokenizer.ggml.add_bos_token` says so; without the key, SentencePiece and the
  Llama-3/tekken splits add it, other byte-level vocabularies do not. EOS is never appended by
  `encode` (`tokenizer.ggml.add_eos_token` is read into `add_eos` and left to the caller): a
  prompt that ends in EOS tells the model the text is over.
* Control tokens (type 3) and unknown tokens (type 2) are matched whole in the text, as chat
  templates need (llama.cpp's parse_special), and dropped by `decode(skip_special=True)`;
  user-defined tokens (type 4: Gemma's "\n\n", runs of spaces and HTML tags, Qwen's `<think>`)
  are matched whole too but are ordinary text when decoding.
* Generation stops at EOS, the file's EOT/EOM ids and llama.cpp's end-of-generation names
  (`<end_of_turn>`, `<|im_end|>`, `<|eot_id|>`, `<|end|>`, ...), which also count as control.
* Phi-3 (`general.architecture == "phi3"`): its added tokens swallow the whitespace after them,
  except `<unk>`, `<s>`, `<|endoftext|>` (rstrip in Phi-3's tokenizer.json; llama.cpp applies the
  same rule to files whose name says Phi-3).
"""

from __future__ import annotations

import math
from array import array
from collections.abc import Iterable
from typing import NamedTuple

import numpy as np
from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..core.errors import PxvmError, shortened
from .gguf_scan import ModelFileError

TOKEN_TYPE_UNKNOWN = 2
TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# GPT-2's split of text into words before BPE; the merges of byte-level vocabularies were
# learned on pieces cut this way.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN35_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
                 r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
# Mistral Nemo / Small 3 ("tekken"): words keep their leading non-letter, digits go one by one.
_TEKKEN_SPLIT = (r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
                 r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
                 r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+")


class _Pre(NamedTuple):
    regex: str
    split_digits: bool = False   # every digit its own piece first (SmolLM2, StarCoder)
    ignore_merges: bool = False  # a word that is a token is taken whole
    add_bos: bool = False        # llama.cpp's default when the file has no add_bos_token


_GPT2 = _Pre(_GPT2_SPLIT)
_DIGITS = _Pre(_GPT2_SPLIT, split_digits=True)
_LLAMA3 = _Pre(_LLAMA3_SPLIT, ignore_merges=True, add_bos=True)
_QWEN2 = _Pre(_QWEN2_SPLIT)

# `tokenizer.ggml.pre` names, as llama.cpp's llama-vocab.cpp groups them.
_PRE_TOKENIZERS = {
    "default": _GPT2, "gpt-2": _GPT2, "phi-2": _GPT2, "mpt": _GPT2, "olmo": _GPT2,
    "smollm": _DIGITS, "starcoder": _DIGITS, "refact": _DIGITS, "codeshell": _DIGITS,
    "command-r": _DIGITS,
    "llama3": _LLAMA3, "llama-v3": _LLAMA3, "llama-bpe": _LLAMA3, "falcon3": _LLAMA3,
    "pixtral": _LLAMA3,
    "smaug-bpe": _Pre(_LLAMA3_SPLIT), "dbrx": _Pre(_LLAMA3_SPLIT),
    "qwen2": _QWEN2, "deepseek-r1-qwen": _QWEN2, "megrez": _QWEN2, "stablelm2": _QWEN2,
    "qwen35": _Pre(_QWEN35_SPLIT),
    "tekken": _Pre(_TEKKEN_SPLIT, ignore_merges=True, add_bos=True),
}

# Token texts that end generation (llama.cpp's end-of-generation list, for these families).
END_OF_GENERATION = ("<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|end|>", "<end_of_turn>",
                     "<|endoftext|>", "<|end_of_text|>", "<EOT>")
# Phi-3's added tokens that keep the whitespace after them (all others drop it).
_PHI3_KEEP_SPACE = ("<unk>", "<s>", "<|endoftext|>")


#: Bounds of a vocabulary, checked before anything is built, above real ones (Gemma 3:
#: 262,144 tokens of 2.3 MB in all, the longest 31 characters; Llama 3: 1.1 MB, the
#: longest 128 characters and 280k merges): building costs time and memory in
#: proportion to them.
MAX_TOKENS = 1 << 19
MAX_VOCAB_BYTES = 16 << 20
MAX_TOKEN_BYTES = 1024
MAX_MERGES = 1 << 22
#: The characters of all merges together (the tokenizers library copies each merge's
#: two texts): Llama 3's are ~2 MB.
MAX_MERGE_CHARS = 32 << 20
#: llama.cpp's token types: 0 undefined, 1 normal, 2 unknown, 3 control, 4 user-defined,
#: 5 unused, 6 byte.
TOKEN_TYPES = range(7)
#: The metadata keys holding token ids.
_ID_KEYS = ("bos_token_id", "eos_token_id", "unknown_token_id", "padding_token_id",
            "eot_token_id", "eom_token_id", "seperator_token_id")
_FLAG_KEYS = ("add_bos_token", "add_eos_token", "add_space_prefix")


class TokenizerError(PxvmError):
    """The GGUF file's tokenizer cannot be built or used."""


class TokenizerFileError(TokenizerError, ModelFileError):
    """A tokenizer field of the model file is missing, of the wrong type, out of range or
    over a bound; the message names the field."""


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary.

    `encode(text)` matches control tokens such as `<|im_start|>` as whole tokens (as chat
    templates need) and adds BOS only where the file asks for it; `decode(ids)` is its
    inverse (decode(encode(s)) == s, except where Phi-3's tokens swallow whitespace)."""

    def __init__(self, metadata: dict, source: str | None = None):
        #: the model file's path, for messages (None: "the model file")
        self.source = source
        _validate(metadata, source or "the model file")
        kind = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        self.tokens: list[str] = list(tokens)
        self.token_types: list[int] = list(metadata.get("tokenizer.ggml.token_type")
                                           or [1] * len(tokens))
        self.kind = kind
        if kind == "gpt2":
            pre = _pre_tokenizer(metadata)
            self._tok = _byte_level_bpe(metadata, pre, source or "the model file")
            default_bos = pre.add_bos
        elif kind == "llama":
            self._tok = _sentencepiece_bpe(metadata, source or "the model file")
            default_bos = True
        else:
            raise TokenizerError(f"tokenizer.ggml.model {kind!r} is not supported "
                                 "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
        # End-of-generation tokens count as control whatever type the file gave them (as in
        # llama.cpp: some Phi-3 files mark <|end|> user-defined).
        for name in END_OF_GENERATION:
            idx = self._tok.token_to_id(name)
            if idx is not None and idx < len(self.token_types):
                self.token_types[idx] = TOKEN_TYPE_CONTROL
        self._add_special_tokens(metadata)
        self.bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_id = metadata.get("tokenizer.ggml.eos_token_id")
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", default_bos))
        self.add_bos = self.add_bos and self.bos_id is not None
        # Read for callers that want it; encode() never appends EOS (see the module notes).
        self.add_eos = bool(metadata.get("tokenizer.ggml.add_eos_token", False))
        self.control_ids = frozenset(i for i, t in enumerate(self.token_types)
                                     if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN))
        # Tokens that end a turn: EOS plus the end-of-turn markers instruct models use.
        stops = {metadata.get(k) for k in ("tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id")}
        for name in END_OF_GENERATION:
            stops.add(self.token_id(name))
        self.stop_ids = frozenset(s for s in stops if s is not None)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _add_special_tokens(self, metadata: dict) -> None:
        # Phi-3's added tokens eat the whitespace that follows them (rstrip in its
        # tokenizer.json); no other family's do.
        phi3 = metadata.get("general.architecture") == "phi3"
        special, plain = [], []
        for token, ttype in zip(self.tokens, self.token_types):
            if ttype in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, TOKEN_TYPE_USER_DEFINED):
                rstrip = phi3 and token not in _PHI3_KEEP_SPACE
                added = AddedToken(token, normalized=False, rstrip=rstrip,
                                   special=ttype != TOKEN_TYPE_USER_DEFINED)
                (plain if ttype == TOKEN_TYPE_USER_DEFINED else special).append(added)
        if special:
            self._tok.add_special_tokens(special)
        if plain:
            self._tok.add_tokens(plain)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; BOS first when `add_bos` (default: as the file says). Never
        EOS: a prompt must leave the text open for the model to go on."""
        encoding = self._tok.encode(text, add_special_tokens=False)
        # BPE drops what the vocabulary cannot spell (no token, no byte token, no <unk>):
        # refuse rather than answer a different prompt.
        covered = bytearray(len(text))
        for start, end in encoding.offsets:
            covered[start:end] = b"\x01" * (end - start)
        missing = covered.find(0)
        if missing >= 0:
            raise TokenizerError(f"the text contains {text[missing]!r}, which this model's "
                                 "vocabulary cannot spell (no token for it or its bytes); "
                                 "remove that character or use another model")
        ids = encoding.ids
        if (self.add_bos if add_bos is None else add_bos) and self.bos_id is not None:
            ids = [self.bos_id] + ids
        return ids

    def decode(self, ids: Iterable[int], skip_special: bool = False) -> str:
        """Text of `ids`; with `skip_special`, control tokens (BOS, <|im_end|>...) are dropped."""
        ids = [int(i) for i in ids]
        if skip_special:
            ids = [i for i in ids if i not in self.control_ids]
        return self._tok.decode(ids, skip_special_tokens=False)

    def stream(self, skip_special: bool = True) -> "StreamDecoder":
        return StreamDecoder(self, skip_special)


class StreamDecoder:
    """Turns tokens arriving one at a time into text pieces.

    A character may span several byte tokens, so a piece is held back while the tail of
    the decoded text is an incomplete UTF-8 sequence (decoded as U+FFFD); the pieces
    concatenate to exactly `decode(all ids)`."""

    def __init__(self, tokenizer: Tokenizer, skip_special: bool = True):
        self.tokenizer = tokenizer
        self.skip_special = skip_special
        self.ids: list[int] = []
        self._prefix = 0   # ids before this are fully emitted and never re-decoded
        self._emitted = ""  # text of ids[_prefix:] already handed out

    def push(self, token_id: int) -> str:
        """Add one token; the new text it completes ('' while a character is incomplete)."""
        tok = self.tokenizer
        if self.skip_special and token_id in tok.control_ids:
            return ""
        self.ids.append(int(token_id))
        text = tok.decode(self.ids[self._prefix:])
        if text.endswith("\ufffd"):
            return ""
        piece = text[len(self._emitted):]
        # Decoding a window can differ from decoding everything at its start (SentencePiece
        # strips the leading space of a sequence), so windows restart only after a character
        # boundary and keep one token of context.
        if len(self.ids) - self._prefix > 8:
            self._prefix = len(self.ids) - 1
            self._emitted = tok.decode(self.ids[self._prefix:])
        else:
            self._emitted = text
        return piece

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the end of generation)."""
        text = self.tokenizer.decode(self.ids[self._prefix:])
        piece = text[len(self._emitted):]
        self._emitted = text
        return piece


def _validate(metadata: dict, source: str) -> None:
    """TokenizerFileError unless every tokenizer field has its type, length and range and
    the vocabulary is within its bounds: checked before building anything."""
    def fail(key: str, problem: str):
        raise TokenizerFileError(f"{source}: metadata 'tokenizer.ggml.{key}' {problem}; the "
                                 "file's tokenizer cannot be used (use another model file)")

    def listed(key: str, kinds: tuple, what: str, n: int | None = None) -> list | None:
        values = metadata.get(f"tokenizer.ggml.{key}")
        if values is None:
            return None
        if not isinstance(values, list):
            fail(key, f"is {type(values).__name__}; it must be an array of {what}")
        if n is not None and len(values) != n:
            fail(key, f"has {len(values):,} values for {n:,} tokens; it must have one a token")
        if not set(map(type, values)) <= set(kinds):  # exact types: no bool for int
            bad = next(i for i, v in enumerate(values) if type(v) not in kinds)
            fail(key, f"holds {type(values[bad]).__name__} at {bad:,}; it must hold {what}")
        return values

    for key in ("model", "pre"):
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is not None and not isinstance(value, str):
            fail(key, f"is {type(value).__name__}; it must be text")
    tokens = listed("tokens", (str,), "strings")
    if not tokens:
        raise TokenizerFileError(f"{source} has no tokenizer.ggml.tokens; it cannot be used "
                                 "for text generation")
    n = len(tokens)
    if n > MAX_TOKENS:
        fail("tokens", f"has {n:,} tokens, over the bound of {MAX_TOKENS:,}")
    sizes = [len(t.encode("utf-8", "surrogatepass")) for t in tokens]
    longest = max(range(n), key=sizes.__getitem__)
    if sizes[longest] > MAX_TOKEN_BYTES:
        fail("tokens", f"holds a token of {sizes[longest]:,} bytes at {longest:,}, over the "
                       f"bound of {MAX_TOKEN_BYTES:,}")
    if sum(sizes) > MAX_VOCAB_BYTES:
        fail("tokens", f"holds {sum(sizes):,} bytes of text, over the bound of "
                       f"{MAX_VOCAB_BYTES:,}")
    types = listed("token_type", (int,), "integers", n)
    if types is not None:
        bad = next((i for i, t in enumerate(types) if t not in TOKEN_TYPES), None)
        if bad is not None:
            fail("token_type", f"is {types[bad]} at {bad:,}; token types are 0 to 6")
    scores = listed("scores", (int, float), "numbers", n)
    if scores is not None and not all(math.isfinite(v) for v in scores):
        fail("scores", "holds values that are not finite numbers")
    merges = listed("merges", (str,), "strings")
    if merges is not None and (len(merges) > MAX_MERGES
                               or sum(map(len, merges)) > MAX_MERGE_CHARS):
        fail("merges", f"has {len(merges):,} merges of {sum(map(len, merges)):,} characters, "
                       f"over the bounds of {MAX_MERGES:,} and {MAX_MERGE_CHARS:,}")
    for key in _ID_KEYS:
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                  or not 0 <= value < n):
            fail(key, f"is {_shown(value)}; it must be a token id from 0 to {n - 1:,}")
    for key in _FLAG_KEYS:
        value = metadata.get(f"tokenizer.ggml.{key}")
        if value is not None and not isinstance(value, bool):
            fail(key, f"is {_shown(value)}; it must be true or false")


def _shown(value) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _pre_tokenizer(metadata: dict) -> _Pre:
    name = metadata.get("tokenizer.ggml.pre") or "default"
    if name not in _PRE_TOKENIZERS:
        raise TokenizerError(f"tokenizer.ggml.pre {name!r} is not supported: its way of "
                             "cutting text into words is unknown here (known: "
                             f"{', '.join(sorted(_PRE_TOKENIZERS))})")
    return _PRE_TOKENIZERS[name]


def _byte_level_bpe(metadata: dict, pre: _Pre, source: str):
    tokens = metadata["tokenizer.ggml.tokens"]
    merges = metadata.get("tokenizer.ggml.merges")
    if not merges:
        raise TokenizerError("a byte-level BPE GGUF needs tokenizer.ggml.merges; the file "
                             "has none")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    bad = next((i for i, pair in enumerate(pairs) if len(pair) != 2), None)
    if bad is not None:
        raise TokenizerFileError(f"{source}: metadata 'tokenizer.ggml.merges' holds "
                                 f"{_shown(merges[bad])} at {bad:,}, which is not two tokens "
                                 "apart; the file's tokenizer cannot be used")
    try:
        model = models.BPE(vocab=vocab, merges=pairs, fuse_unk=False,
                           ignore_merges=pre.ignore_merges)
    except Exception as exc:  # noqa: BLE001 - the library's check of the merges' tokens
        raise TokenizerFileError(f"{source}: metadata 'tokenizer.ggml.merges' names a token "
                                 f"the vocabulary lacks ({shortened(str(exc), 200)}); the "
                                 "file's tokenizer cannot be used") from exc
    tok = HFTokenizer(model)
    steps = []
    if pre.split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.Split(Regex(pre.regex), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _derived_merges(tokens: list[str], scores: list[float], types: list[int],
                    vocab: dict[str, int], source: str) -> list[tuple[str, str]]:
    """SentencePiece's merges: every cut of a normal token into two normal tokens, the
    merge of the best-scored result first (ties by the parts' ids). Each token's cuts
    are tried once (a slice of at most MAX_TOKEN_BYTES each): time in proportion to the
    vocabulary's characters; the merges found are kept as ids in arrays until sorted."""
    mergeable = {tok for tok, t in zip(tokens, types) if t == 1}
    made, lefts, rights = array("q"), array("q"), array("q")
    chars = 0
    for tok in mergeable:
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in mergeable and right in mergeable:
                made.append(vocab[tok])
                lefts.append(vocab[left])
                rights.append(vocab[right])
                chars += len(tok)
        if len(made) > MAX_MERGES or chars > MAX_MERGE_CHARS:
            raise TokenizerFileError(
                f"{source}: the SentencePiece vocabulary (metadata 'tokenizer.ggml.tokens') "
                f"makes more than {MAX_MERGES:,} merges or {MAX_MERGE_CHARS:,} characters "
                "of them; the file's tokenizer cannot be used")
    score = np.asarray(scores, np.float64)
    lefts_np, rights_np = np.frombuffer(lefts, np.int64), np.frombuffer(rights, np.int64)
    order = np.lexsort((rights_np, lefts_np, -score[np.frombuffer(made, np.int64)]))
    return [(tokens[left], tokens[right])
            for left, right in zip(lefts_np[order].tolist(), rights_np[order].tolist())]


def _sentencepiece_bpe(metadata: dict, source: str):
    """SentencePiece BPE: a piece's score ranks the merge that makes it; bytes missing from
    the vocabulary fall back to <0xNN> tokens; spaces are spelled '▁'."""
    tokens = metadata["tokenizer.ggml.tokens"]
    scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    merges = _derived_merges(tokens, scores, types, vocab, source)
    unk = metadata.get("tokenizer.ggml.unknown_token_id")
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=merges, byte_fallback=True, fuse_unk=True,
                                 unk_token=tokens[unk] if unk is not None else None))
    steps = []
    if metadata.get("tokenizer.ggml.add_space_prefix", True):
        steps.append(normalizers.Prepend("▁"))
    steps.append(normalizers.Replace(" ", "▁"))
    tok.normalizer = normalizers.Sequence(steps)
    dec = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if metadata.get("tokenizer.ggml.add_space_prefix", True):
        dec.append(decoders.Strip(" ", 1, 0))
    tok.decoder = decoders.Sequence(dec)
    return tok
