"""Choosing the next token from logits: greedy, or temperature / top-k / top-p sampling
with a repetition penalty, reproducible for a given seed (numpy Generator)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np


@dataclass
class SamplingParams:
    """temperature 0 means greedy (argmax); top_k 0 and top_p 1 switch those filters off;
    repeat_penalty 1 switches the penalty off; it looks at the last `repeat_last_n` tokens."""

    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    repeat_penalty: float = 1.0
    repeat_last_n: int = 64
    seed: int | None = None

    def __post_init__(self):
        for name, value in (("temperature", self.temperature), ("top_p", self.top_p),
                            ("repeat_penalty", self.repeat_penalty)):
            if not math.isfinite(value):
                raise ValueError(f"{name} must be a finite number, not {value}")
        if self.temperature < 0:
            raise ValueError("temperature must be >= 0 (0 = greedy)")
        if self.top_k < 0:
            raise ValueError("top_k must be >= 0 (0 = off)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError("top_p must be in (0, 1] (1 = off)")
        if self.repeat_penalty <= 0:
            raise ValueError("repeat_penalty must be > 0 (1 = off)")
        if self.seed is not None and self.seed < 0:
            raise ValueError("seed must be >= 0")


def apply_repetition_penalty(logits: np.ndarray, previous: Sequence[int],
                             penalty: float) -> np.ndarray:
    """The CTRL penalty as llama.cpp and Hugging Face apply it: each distinct previous
    token's logit is divided by `penalty` when positive and multiplied when negative, so
    penalty > 1 always makes it less likely."""
    out = np.array(logits, dtype=np.float32, copy=True)
    if penalty == 1.0 or len(previous) == 0:
        return out
    ids = np.unique(np.asarray(previous, dtype=np.int64))
    vals = out[ids]
    out[ids] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def top_k_mask(logits: np.ndarray, k: int) -> np.ndarray:
    """True for the k largest logits (all when k is 0 or >= vocab); ties at the k-th value
    are cut by index so exactly k survive."""
    n = logits.shape[-1]
    if k <= 0 or k >= n:
        return np.ones(n, dtype=bool)
    keep = np.argpartition(-logits, k - 1)[:k]
    mask = np.zeros(n, dtype=bool)
    mask[keep] = True
    return mask


#: top_p_mask first looks among the tokens at least as likely as the TOP_P_CANDIDATES-th
#: most likely one; only when they do not reach p does it sort the whole vocabulary (a
#: stable sort of a 49,152-token vocabulary takes longer than a decoding step on a GPU;
#: docs/benchmarks-log.md has the sampler's timings).
TOP_P_CANDIDATES = 1024


def top_p_mask(probs: np.ndarray, p: float) -> np.ndarray:
    """True for the smallest set of most likely tokens whose probabilities sum to >= p
    (ties ordered by index)."""
    if p >= 1.0:
        return probs > 0
    order = cumulative = None
    if probs.size > TOP_P_CANDIDATES:
        # Every nonzero token as likely as the candidate bound, ties included, in index
        # order: sorted stably, they are the start of a stable sort of all, with the same
        # running sums.
        chosen = probs > 0
        if np.count_nonzero(chosen) > TOP_P_CANDIDATES:  # else (after top-k) all of them
            k = probs.size - TOP_P_CANDIDATES
            chosen &= probs >= np.partition(probs, k)[k]
        candidates = np.flatnonzero(chosen)
        order = candidates[np.argsort(-probs[candidates], kind="stable")]
        cumulative = np.cumsum(probs[order], dtype=np.float64)
        if cumulative.size == 0 or cumulative[-1] < p:
            order = None
    if order is None:
        order = np.argsort(-probs, kind="stable")
        cumulative = np.cumsum(probs[order], dtype=np.float64)
    count = int(np.searchsorted(cumulative, p, side="left")) + 1
    mask = np.zeros(probs.shape[-1], dtype=bool)
    mask[order[:min(count, order.size)]] = True
    return mask


def penalized(logits: np.ndarray, params: "SamplingParams", previous: Sequence[int]) -> np.ndarray:
    """Logits after the repetition penalty over the last `repeat_last_n` tokens."""
    window = list(previous)[-params.repeat_last_n:] if params.repeat_last_n > 0 else []
    return apply_repetition_penalty(logits, window, params.repeat_penalty)


def next_token_probs(logits: np.ndarray, params: SamplingParams,
                     previous: Sequence[int] = ()) -> np.ndarray:
    """The distribution a sampling step draws from (float32, summing to 1 in float64):
    penalty, then top-k on logits, temperature, softmax, then top-p and renormalisation.
    In float32: float64's exponentials of a 128k vocabulary took 2.8 ms a token, which a
    batch of 64 sequences pays 64 times a step."""
    z = penalized(logits, params, previous)
    if params.top_k > 0:  # filters that are off cost no masks (sampling runs every token)
        z[~top_k_mask(z, params.top_k)] = -np.inf
    finite = np.isfinite(z)
    if not finite.all():  # masked (and NaN) logits weigh 0
        z[~finite] = -np.inf
    z *= np.float32(1.0 / params.temperature)
    probs = np.exp(z - z.max())
    probs /= probs.sum(dtype=np.float64)
    if params.top_p < 1.0:
        probs[~top_p_mask(probs, params.top_p)] = 0.0
        probs /= probs.sum(dtype=np.float64)
    return probs


class Sampler:
    """Draws tokens with one seeded Generator, so a seed fixes the whole sequence."""

    def __init__(self, params: SamplingParams | None = None):
        self.params = params or SamplingParams()
        self.rng = np.random.default_rng(self.params.seed)

    def __call__(self, logits: np.ndarray, previous: Sequence[int] = ()) -> int:
        p = self.params
        if p.temperature == 0.0:
            return int(np.argmax(penalized(logits, p, previous)))
        return draw(next_token_probs(logits, p, previous), self.rng.random())


#: Tokens whose weights draw() sums a block at a time: the running sums of a whole
#: vocabulary (a sequential cumsum) took longer than the rest of a draw.
DRAW_BLOCK = 512


def draw(weights: np.ndarray, u: float) -> int:
    """The token whose running sum of weights first passes u (in [0, 1)) times their
    total, as Generator.choice draws: found block by block (the blocks' sums, then the
    running sums inside one), never a token of weight 0."""
    n = weights.size
    whole = n // DRAW_BLOCK * DRAW_BLOCK
    sums = np.append(weights[:whole].reshape(-1, DRAW_BLOCK).sum(axis=1, dtype=np.float64),
                     weights[whole:].sum(dtype=np.float64))
    running = np.cumsum(sums)
    target = u * running[-1]
    # the block where the running sum passes the target (a block of weight: its sum > 0)
    b = min(int(np.searchsorted(running, target, side="right")), len(sums) - 1)
    while sums[b] == 0:  # rounding at the very end: the last block with weight
        b -= 1
    start = b * DRAW_BLOCK
    inside = np.cumsum(weights[start:start + DRAW_BLOCK], dtype=np.float64)
    i = int(np.searchsorted(inside, target - (running[b - 1] if b else 0.0), side="right"))
    heavy = np.flatnonzero(weights[start:start + DRAW_BLOCK])
    return start + int(heavy[np.searchsorted(heavy, min(i, heavy[-1]))])
