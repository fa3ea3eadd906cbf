"""Constrained decoding for `response_format` (json_object, json_schema) through llguidance.

Why llguidance: it ships one abi3 wheel per platform (Linux x86_64/aarch64, macOS,
Windows) with no dependencies, computes each step's token mask lazily from the grammar
(no index over the whole vocabulary built per schema first, as outlines-core does), and
needs neither torch nor transformers (xgrammar requires both, and triton on Linux)."""

from __future__ import annotations

import json
import threading

import llguidance
import numpy as np

from ..core.errors import PxvmError, shortened
from ..llm.tokenizer import TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN, Tokenizer

#: JSON with any keys and values, for response_format {"type": "json_object"}
ANY_JSON_OBJECT = {"type": "object"}
#: llguidance's marker for a special token's bytes (never part of text)
_SPECIAL = b"\xff"


class GrammarError(PxvmError):
    """A response_format whose schema llguidance cannot compile; answered 400."""


def _byte_level_decoder() -> dict[str, int]:
    """GPT-2's byte-level alphabet: the printable character standing for each byte."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    chars, extra = {}, 0
    for b in range(256):
        if b in printable:
            chars[chr(b)] = b
        else:
            chars[chr(256 + extra)] = b
            extra += 1
    return chars


def token_bytes(tokenizer: Tokenizer) -> list[bytes]:
    """The bytes each token of the vocabulary spells (control tokens marked special)."""
    byte_level = _byte_level_decoder() if tokenizer.kind == "gpt2" else None
    out = []
    for text, kind in zip(tokenizer.tokens, tokenizer.token_types):
        if kind in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_UNKNOWN):
            out.append(_SPECIAL + text.encode("utf-8", "surrogatepass"))
        elif byte_level is not None and all(c in byte_level for c in text):
            out.append(bytes(byte_level[c] for c in text))
        elif byte_level is None and len(text) == 6 and text.startswith("<0x") and text.endswith(">"):
            out.append(bytes([int(text[3:5], 16)]))  # SentencePiece's byte fallback
        else:
            out.append(text.replace("▁", " ").encode("utf-8", "surrogatepass"))
    return out


class _Vocabulary:
    """What llguidance.TokenizerWrapper reads of a tokenizer."""

    def __init__(self, tokenizer: Tokenizer, stop_ids: frozenset[int]):
        self.tokens = token_bytes(tokenizer)
        self.eos_token_id = min(stop_ids) if stop_ids else tokenizer.eos_id
        self.bos_token_id = tokenizer.bos_id
        self.special_token_ids = sorted(tokenizer.control_ids)
        self._tokenizer = tokenizer

    def __call__(self, text: str) -> list[int]:
        return self._tokenizer.encode(text, add_bos=False)


class JsonGrammars:
    """Compiles response formats into logits processors for one model's vocabulary."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int):
        stops = tokenizer.stop_ids
        wrapper = llguidance.TokenizerWrapper(_Vocabulary(tokenizer, stops))
        eos = sorted(stops) or None
        self.tokenizer = llguidance.LLTokenizer(wrapper, n_vocab=vocab_size, eos_token=eos)
        self.vocab_size = vocab_size
        self._lock = threading.Lock()

    def processor(self, schema: dict | None) -> "JsonConstraint":
        """A fresh constraint (one per sequence) to JSON matching `schema` (None: any
        object). Raises GrammarError when the schema does not compile."""
        try:
            grammar = llguidance.LLMatcher.grammar_from_json_schema(
                json.dumps(ANY_JSON_OBJECT if schema is None else schema),
                defaults={"whitespace_flexible": False})  # no runs of blanks to wander into
        except (ValueError, TypeError) as exc:
            raise GrammarError(f"the JSON schema is not valid: {shortened(str(exc), 300)}") from exc
        with self._lock:
            problem = llguidance.LLMatcher.validate_grammar(grammar, self.tokenizer)
        if problem and not problem.startswith("WARNING"):
            raise GrammarError(f"the JSON schema cannot be used: {shortened(problem, 300)}")
        return JsonConstraint(llguidance.LLMatcher(self.tokenizer, grammar, log_level=0),
                              self.vocab_size)


class JsonConstraint:
    """The engine's logits_processor: masks every token the grammar forbids next (the stop
    tokens once the JSON is complete). Called from the engine's thread, one call a step."""

    def __init__(self, matcher, vocab_size: int):
        self.matcher = matcher
        self.vocab_size = vocab_size
        self.consumed = 0
        self.bitmask = np.zeros((vocab_size + 31) // 32, dtype=np.int32)

    def __call__(self, generated: list[int], logits: np.ndarray) -> np.ndarray:
        for token in generated[self.consumed:]:
            self.matcher.consume_token(int(token))
        self.consumed = len(generated)
        self.matcher.unsafe_compute_mask_ptr(self.bitmask.ctypes.data, self.bitmask.nbytes)
        allowed = np.unpackbits(self.bitmask.view(np.uint8), bitorder="little")
        allowed = allowed[:logits.shape[-1]].astype(bool)
        out = np.array(logits, dtype=np.float32, copy=True)
        out[:allowed.size][~allowed] = -np.inf
        out[allowed.size:] = -np.inf
        return out
