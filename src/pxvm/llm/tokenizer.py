"""Tokenizer built from a GGUF file's own vocabulary: byte-level BPE (GPT-2 / SmolLM2 /
Llama-3 style, `tokenizer.ggml.model == "gpt2"`) and SentencePiece BPE with byte fallback
(Llama / TinyLlama style, `"llama"`), both run by the `tokenizers` library; plus a
streaming decoder that yields text as tokens arrive without splitting UTF-8 characters."""

from __future__ import annotations

from typing import Iterable

from tokenizers import AddedToken, Regex, decoders, models, normalizers, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from ..runtime.errors import PxvmError

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

# GPT-2's split of text into words before BPE; the merges of byte-level vocabularies were
# learned on pieces cut this way.
_GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_LLAMA3_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
_QWEN2_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# `tokenizer.ggml.pre` names (llama.cpp's) -> (split digits one by one first?, word regex).
# SmolLM2 and the StarCoder family were trained with every digit its own piece.
_PRE_TOKENIZERS = {
    "default": (False, _GPT2_SPLIT),
    "gpt-2": (False, _GPT2_SPLIT),
    "smollm": (True, _GPT2_SPLIT),
    "starcoder": (True, _GPT2_SPLIT),
    "refact": (True, _GPT2_SPLIT),
    "codeshell": (True, _GPT2_SPLIT),
    "llama3": (False, _LLAMA3_SPLIT),
    "llama-v3": (False, _LLAMA3_SPLIT),
    "llama-bpe": (False, _LLAMA3_SPLIT),
    "smaug-bpe": (False, _LLAMA3_SPLIT),
    "qwen2": (False, _QWEN2_SPLIT),
}


class TokenizerError(PxvmError):
    """The GGUF file's tokenizer cannot be built or used."""


class Tokenizer:
    """Text <-> token ids for one GGUF vocabulary.

    `encode(text)` matches control tokens such as `<|im_start|>` as whole tokens (as chat
    templates need) and adds BOS only where the file asks for it; `decode(ids)` is its
    inverse (decode(encode(s)) == s)."""

    def __init__(self, metadata: dict):
        kind = metadata.get("tokenizer.ggml.model")
        tokens = metadata.get("tokenizer.ggml.tokens")
        if not tokens:
            raise TokenizerError("the GGUF file has no tokenizer.ggml.tokens; it cannot be "
                                 "used for text generation")
        self.tokens: list[str] = list(tokens)
        self.token_types: list[int] = list(metadata.get("tokenizer.ggml.token_type")
                                           or [1] * len(tokens))
        self.kind = kind
        if kind == "gpt2":
            self._tok = _byte_level_bpe(metadata)
        elif kind == "llama":
            self._tok = _sentencepiece_bpe(metadata)
        else:
            raise TokenizerError(f"tokenizer.ggml.model {kind!r} is not supported "
                                 "(supported: 'gpt2' byte-level BPE, 'llama' SentencePiece)")
        self._add_special_tokens()
        self.bos_id = metadata.get("tokenizer.ggml.bos_token_id")
        self.eos_id = metadata.get("tokenizer.ggml.eos_token_id")
        default_bos = kind == "llama"
        self.add_bos = bool(metadata.get("tokenizer.ggml.add_bos_token", default_bos))
        self.add_bos = self.add_bos and self.bos_id is not None
        self.control_ids = frozenset(i for i, t in enumerate(self.token_types)
                                     if t == TOKEN_TYPE_CONTROL)
        # Tokens that end a turn: EOS plus the end-of-turn markers instruct models use.
        stops = {metadata.get(k) for k in ("tokenizer.ggml.eos_token_id",
                                           "tokenizer.ggml.eot_token_id",
                                           "tokenizer.ggml.eom_token_id")}
        for name in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>", "<|endoftext|>"):
            idx = self.token_id(name)
            if idx is not None and idx in self.control_ids:
                stops.add(idx)
        self.stop_ids = frozenset(s for s in stops if s is not None)

    @property
    def vocab_size(self) -> int:
        return len(self.tokens)

    def token_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def _add_special_tokens(self) -> None:
        special, plain = [], []
        for token, ttype in zip(self.tokens, self.token_types):
            if ttype == TOKEN_TYPE_CONTROL:
                special.append(AddedToken(token, normalized=False, special=True))
            elif ttype == TOKEN_TYPE_USER_DEFINED:
                plain.append(AddedToken(token, normalized=False, special=False))
        if special:
            self._tok.add_special_tokens(special)
        if plain:
            self._tok.add_tokens(plain)

    def encode(self, text: str, add_bos: bool | None = None) -> list[int]:
        """Token ids of `text`; BOS first when `add_bos` (default: as the file says)."""
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


def _byte_level_bpe(metadata: dict):
    tokens = metadata["tokenizer.ggml.tokens"]
    merges = metadata.get("tokenizer.ggml.merges")
    if not merges:
        raise TokenizerError("a byte-level BPE GGUF needs tokenizer.ggml.merges; the file "
                             "has none")
    vocab = {tok: i for i, tok in enumerate(tokens)}
    pairs = [tuple(m.split(" ", 1)) for m in merges]
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=pairs, fuse_unk=False))
    pre = metadata.get("tokenizer.ggml.pre", "default")
    split_digits, regex = _PRE_TOKENIZERS.get(pre, _PRE_TOKENIZERS["default"])
    steps = []
    if split_digits:
        steps.append(pre_tokenizers.Digits(individual_digits=True))
    steps.append(pre_tokenizers.Split(Regex(regex), behavior="isolated"))
    steps.append(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False))
    tok.pre_tokenizer = pre_tokenizers.Sequence(steps)
    tok.decoder = decoders.ByteLevel()
    return tok


def _sentencepiece_bpe(metadata: dict):
    """SentencePiece BPE: a piece's score ranks the merge that makes it; bytes missing from
    the vocabulary fall back to <0xNN> tokens; spaces are spelled '▁'."""
    tokens = metadata["tokenizer.ggml.tokens"]
    scores = metadata.get("tokenizer.ggml.scores") or [0.0] * len(tokens)
    types = metadata.get("tokenizer.ggml.token_type") or [1] * len(tokens)
    vocab = {tok: i for i, tok in enumerate(tokens)}
    mergeable = {tok for tok, t in zip(tokens, types) if t == 1}
    found = []
    for tok in mergeable:
        for cut in range(1, len(tok)):
            left, right = tok[:cut], tok[cut:]
            if left in mergeable and right in mergeable:
                found.append((-scores[vocab[tok]], vocab[left], vocab[right], left, right))
    found.sort()
    merges = [(left, right) for *_, left, right in found]
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
