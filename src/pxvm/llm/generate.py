"""Streaming text generation: prompt (or chat) in, text pieces out as tokens come, with
prefill and decode speeds."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .chat import render_chat
from .sampling import SamplingParams, sample
from .tokenizer import StreamDecoder, Tokenizer


@dataclass
class GenerationResult:
    text: str
    tokens: list = field(default_factory=list)
    prompt_tokens: int = 0
    prefill_seconds: float = 0.0
    decode_seconds: float = 0.0
    stop_reason: str = ""

    @property
    def prompt_tokens_per_second(self) -> float:
        return self.prompt_tokens / self.prefill_seconds if self.prefill_seconds else 0.0

    @property
    def generation_tokens_per_second(self) -> float:
        # the first generated token comes from the prefill; the rest from decode steps
        steps = max(len(self.tokens) - 1, 0)
        return steps / self.decode_seconds if self.decode_seconds else 0.0


def stop_token_ids(tokenizer: Tokenizer, chat: bool) -> set[int]:
    ids = {tokenizer.eos_id} if tokenizer.eos_id is not None else set()
    for text in ("<|im_end|>", "<|eot_id|>", "<|end|>") if chat else ():
        tid = tokenizer.token_id(text)
        if tid is not None:
            ids.add(tid)
    return ids


def generate(model, tokenizer: Tokenizer, prompt: str, max_tokens: int = 128,
             params: SamplingParams | None = None, chat: bool = False,
             stop: tuple[str, ...] = (), on_text: Callable[[str], None] | None = None,
             history: list[dict] | None = None) -> GenerationResult:
    """Generate up to `max_tokens` after `prompt` (a user message if `chat`), calling
    `on_text` with each new piece of text."""
    params = params or SamplingParams()
    rng = np.random.default_rng(params.seed)
    if chat:
        messages = list(history or []) + [{"role": "user", "content": prompt}]
        text = render_chat(model.metadata, tokenizer, messages)
        ids = tokenizer.encode(text, add_bos=False)
    else:
        ids = tokenizer.encode(prompt)
    if not ids:
        ids = [tokenizer.bos_id if tokenizer.bos_id is not None else 0]
    model.reset()
    stops = stop_token_ids(tokenizer, chat)
    result = GenerationResult(text="", prompt_tokens=len(ids))
    t0 = time.perf_counter()
    logits = model.forward(ids)
    result.prefill_seconds = time.perf_counter() - t0
    stream = StreamDecoder(tokenizer)
    previous = list(ids)
    t1 = time.perf_counter()
    while True:
        token = sample(logits, params, rng, previous)
        if token in stops:
            result.stop_reason = "end of text"
            break
        result.tokens.append(token)
        previous.append(token)
        piece = stream.push(token)
        result.text += piece
        hit = next((s for s in stop if s in result.text), None)
        if hit is not None:
            result.text = result.text[: result.text.index(hit)]
            result.stop_reason = f"stop string {hit!r}"
            break
        if piece and on_text is not None:
            on_text(piece)
        if len(result.tokens) >= max_tokens:
            result.stop_reason = "max tokens"
            break
        if model.position >= model.context_length:
            result.stop_reason = "context full"
            break
        logits = model.forward([token])
    result.decode_seconds = time.perf_counter() - t1
    return result
