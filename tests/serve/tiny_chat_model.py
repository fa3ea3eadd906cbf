"""A tiny random-weight GGUF model with a working byte-level BPE tokenizer and ChatML
special tokens, so that any text encodes and chat templates render (its output is
random bytes, but every API path runs on it quickly)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from make_tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402

SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
_MERGES = [("h", "e"), ("l", "l"), ("Ġ", "t"), ("Ġt", "he"), ("o", "r")]


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-ins for the 256 bytes, in byte order."""
    printable = (list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
                 + list(range(ord("®"), ord("ÿ") + 1)))
    out, extra = [], 0
    for b in range(256):
        if b in printable:
            out.append(chr(b))
        else:
            out.append(chr(256 + extra))
            extra += 1
    return out


def tiny_chat_tokenizer() -> dict:
    tokens = _byte_alphabet() + [a + b for a, b in _MERGES] + SPECIALS
    types = [1] * (len(tokens) - len(SPECIALS)) + [3] * len(SPECIALS)
    return {
        "tokenizer.ggml.model": "gpt2",
        "tokenizer.ggml.pre": "default",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.merges": [f"{a} {b}" for a, b in _MERGES],
        "tokenizer.ggml.eos_token_id": tokens.index("<|im_end|>"),
        "tokenizer.ggml.bos_token_id": tokens.index("<|endoftext|>"),
    }


def write_tiny_chat_model(path: Path, context_length: int = 256, seed: int = 0) -> Path:
    tokenizer = tiny_chat_tokenizer()
    spec = TinySpec(n_layers=1, dim=32, n_heads=2, n_kv_heads=1, ffn_dim=64,
                    vocab_size=len(tokenizer["tokenizer.ggml.tokens"]),
                    context_length=context_length, tokenizer=tokenizer)
    write_tiny_gguf(str(path), spec, np.random.default_rng(seed))
    return path
