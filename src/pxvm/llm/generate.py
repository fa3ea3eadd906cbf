"""The generation loop: prompt (plain or through the chat template) -> prefill -> one token
at a time until EOS / end-of-turn, a stop string or max_tokens, streaming text pieces as
they are decoded and timing prefill and decode separately."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Iterator, Protocol, Sequence

import numpy as np

from ..ops.decoding import sampled_logits
from ..core.errors import PxvmError
from .chat import chat_template_of, render_chat, special_token_texts
from .sampling import Sampler, SamplingParams
from .tokenizer import Tokenizer


class PromptTooLongError(PxvmError):
    """The prompt does not leave room in the model's context for even one new token."""


@dataclass
class GenerationResult:
    text: str
    token_ids: list[int]
    prompt_tokens: int
    stop_reason: str            # "eos", "stop_string", "max_tokens" or "context"
    prefill_s: float
    decode_s: float
    decode_steps: int           # forward calls of single tokens timed in decode_s
    prompt_ids: list[int] = field(default_factory=list)

    @property
    def generated_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def prompt_tokens_per_s(self) -> float:
        return self.prompt_tokens / self.prefill_s if self.prefill_s > 0 else 0.0

    @property
    def generation_tokens_per_s(self) -> float:
        return self.decode_steps / self.decode_s if self.decode_s > 0 else 0.0


class LanguageModel(Protocol):
    """What generation needs of a model (pxvm.llm.Model is one)."""

    metadata: dict
    context_length: int
    position: int
    backend_name: str
    device_name: str

    def reset(self) -> None: ...

    def forward(self, token_ids) -> np.ndarray:
        """Logits (vocab,) of the last of `token_ids`, run at the current position."""
        ...

    def decode(self, token: int, n: int, temperature: float = 0.0,
               seed: int = 0) -> Iterator[int]:
        """Feed `token`, then each token drawn from the last step's logits (the argmax
        at temperature 0, else sampled_logits' draw for that position): the n chosen."""
        ...


def context_length(model: LanguageModel) -> int:
    return model.context_length


def chat_prompt(tokenizer: Tokenizer, metadata: dict, messages: list[dict]) -> str:
    """The rendered chat prompt for `messages`, assistant turn opened; the template gets
    the file's special tokens' texts as transformers gives them."""
    return render_chat(messages, chat_template_of(metadata), add_generation_prompt=True,
                       source=tokenizer.source, **special_token_texts(metadata))


def encode_prompt(model: LanguageModel, tokenizer: Tokenizer, prompt: str | None = None, chat: bool = False,
                  messages: list[dict] | None = None) -> list[int]:
    """The token ids generation feeds `model`: encode_text with the model's metadata."""
    return encode_text(tokenizer, model.metadata, prompt, chat, messages)


def encode_text(tokenizer: Tokenizer, metadata: dict, prompt: str | None = None,
                chat: bool = False, messages: list[dict] | None = None) -> list[int]:
    """The token ids of `prompt`, or of the chat `messages` (or of `prompt` as the user's
    message when `chat`) rendered with the template in `metadata`, assistant turn opened."""
    if chat or messages is not None:
        msgs = messages if messages is not None else [{"role": "user", "content": prompt}]
        text = chat_prompt(tokenizer, metadata, msgs)
        ids = tokenizer.encode(text)
        # Templates that write the BOS token themselves must not get a second one.
        if (tokenizer.bos_id is not None and len(ids) > 1 and ids[0] == ids[1] == tokenizer.bos_id):
            ids = ids[1:]
        return ids
    return tokenizer.encode(prompt)


def held_back(text: str, stops: Sequence[str]) -> int:
    """How many trailing characters might be the start of a stop string."""
    held = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), held, -1):
            if text.endswith(s[:k]):
                held = k
                break
    return held


def generate(model: LanguageModel, tokenizer: Tokenizer, prompt: str | None = None, max_tokens: int = 128,
             sampling: SamplingParams | None = None, chat: bool = False,
             stream: Callable[[str], None] | None = None, stop: Sequence[str] = (),
             messages: list[dict] | None = None) -> GenerationResult:
    """Generate up to `max_tokens` tokens after `prompt` (or after the chat `messages`
    rendered with the model's template when `chat`/`messages` is given), calling
    `stream(piece)` with text as soon as it is certain; the pieces concatenate to
    `result.text`. The model's cache is reset first."""
    if max_tokens < 0:
        raise ValueError("max_tokens must be >= 0")
    prompt_ids = encode_prompt(model, tokenizer, prompt, chat, messages)
    if not prompt_ids:
        raise PromptTooLongError("the prompt is empty after tokenization; give some text")
    n_ctx = context_length(model)
    if len(prompt_ids) >= n_ctx:
        raise PromptTooLongError(
            f"the prompt is {len(prompt_ids)} tokens but the model's context is {n_ctx}; "
            "shorten the prompt")
    sampler = Sampler(sampling)
    stop_ids = tokenizer.stop_ids
    stops = [s for s in stop if s]
    decoder = tokenizer.stream(skip_special=True)
    emit = stream or (lambda piece: None)

    model.reset()
    t0 = time.perf_counter()
    logits = model.forward(prompt_ids)
    prefill_s = time.perf_counter() - t0

    generated: list[int] = []
    text, emitted = "", 0
    reason = "max_tokens"
    received = 0
    t1 = time.perf_counter()
    source = _tokens(model, sampler, logits, prompt_ids, generated, max_tokens)
    try:
        for i, token in enumerate(source if max_tokens > 0 else ()):
            received = i + 1
            if token in stop_ids:
                reason = "eos"
                break
            generated.append(token)
            text += decoder.push(token)
            hit = min((text.find(s) for s in stops if s in text), default=-1)
            if hit >= 0:
                text = text[:hit]
                reason = "stop_string"
                break
            safe = len(text) - held_back(text, stops)
            if safe > emitted:
                emit(text[emitted:safe])
                emitted = safe
            if i == max_tokens - 1:
                break
            if len(prompt_ids) + len(generated) >= n_ctx:
                reason = "context"
                break
    finally:
        source.close()
    steps = max(0, received - 1)  # the first token came from the prompt's logits
    decode_s = time.perf_counter() - t1
    if reason != "stop_string":
        text += decoder.flush()
    if len(text) > emitted:
        emit(text[emitted:])
    return GenerationResult(text=text, token_ids=generated, prompt_tokens=len(prompt_ids),
                            stop_reason=reason, prefill_s=prefill_s, decode_s=decode_s,
                            decode_steps=steps, prompt_ids=prompt_ids)


def device_seed(seed: int | None) -> int:
    """The 24-bit seed of draws made on the device, from a user's seed (None: fresh)."""
    return int(np.random.SeedSequence(seed).generate_state(1)[0]) % (1 << 24)


def _tokens(model: LanguageModel, sampler: Sampler, logits, prompt_ids: list[int], generated: list[int],
            max_tokens: int):
    """The chosen tokens, one per decoding step: the first from the prompt's logits.
    Greedy decoding and plain temperature sampling let the model chain its steps on the
    device, drawing each token where its logits are (`decode`); top-k, top-p and
    the repetition penalty bring each step's logits back to the host's sampler.
    `generated` is the caller's list of accepted tokens (the repetition penalty looks at
    it)."""
    p = sampler.params
    if p.top_k == 0 and p.top_p >= 1.0 and p.repeat_penalty == 1.0:
        seed = device_seed(p.seed)
        # the draw from the logits at position q uses counter q, as the device's steps do
        z = sampled_logits(logits, p.temperature, seed, len(prompt_ids) - 1)
        token = int(np.argmax(z))
        yield token
        room = context_length(model) - len(prompt_ids)
        yield from model.decode(token, min(max_tokens - 1, room), p.temperature, seed)
        return
    token = sampler(logits, prompt_ids + generated)
    yield token
    while True:
        logits = model.forward([token])
        token = sampler(logits, prompt_ids + generated)
        yield token


def benchmark(model: LanguageModel, tokenizer: Tokenizer, prompt_tokens: int = 512, gen_tokens: int = 128,
              repeats: int = 3, warmup: int = 1, depth: int = 0) -> dict:
    """Prefill and decode speed measured as llama-bench's pp and tg tests: prefill is one
    `prompt_tokens`-token forward; decode is `gen_tokens` greedy steps from one token.
    Each starts from a fresh context holding `depth` tokens already (llama-bench's -d;
    0 by default, as its tg128, which decodes from an empty context). Medians of
    `repeats` runs after `warmup` unmeasured runs (which compile pipelines and fill
    caches). Tokens are seeded random ids from the vocabulary, as llama-bench's: speed
    does not depend on them, and any vocabulary can spell them."""
    if prompt_tokens < 1 or gen_tokens < 1 or repeats < 1 or depth < 0:
        raise ValueError("prompt_tokens, gen_tokens and repeats must be >= 1, depth >= 0")
    n_ctx = context_length(model)
    if depth + max(prompt_tokens, gen_tokens) > n_ctx:
        raise PromptTooLongError(
            f"{depth} + {max(prompt_tokens, gen_tokens)} tokens exceed the model's context of "
            f"{n_ctx}; lower --depth, --prompt-tokens or --gen-tokens")
    rng = np.random.default_rng(0)
    context = rng.integers(0, tokenizer.vocab_size, depth).tolist()
    ids = rng.integers(0, tokenizer.vocab_size, prompt_tokens).tolist()
    first = int(rng.integers(0, tokenizer.vocab_size))

    def fresh_context():
        model.reset()
        if context:
            model.forward(context)

    runs = []
    for run in range(warmup + repeats):
        fresh_context()
        t0 = time.perf_counter()
        model.forward(ids)
        prefill_s = time.perf_counter() - t0
        fresh_context()
        t0 = time.perf_counter()
        for _ in model.decode(first, gen_tokens):
            pass
        decode_s = time.perf_counter() - t0
        if run >= warmup:
            runs.append({"prefill_s": prefill_s, "decode_s": decode_s,
                         "prefill_tokens_per_s": prompt_tokens / prefill_s,
                         "decode_tokens_per_s": gen_tokens / decode_s})
    return {
        "backend": model.backend_name,
        "device": model.device_name,
        "kv_cache": model.kv_cache,
        "prompt_tokens": prompt_tokens,
        "gen_tokens": gen_tokens,
        "depth": depth,
        "repeats": repeats,
        "warmup": warmup,
        "prefill_tokens_per_s": float(np.median([r["prefill_tokens_per_s"] for r in runs])),
        "decode_tokens_per_s": float(np.median([r["decode_tokens_per_s"] for r in runs])),
        "runs": runs,
    }
