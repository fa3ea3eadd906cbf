"""Choosing the next token: greedy, temperature, top-k, top-p and repetition penalty."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass
class SamplingParams:
    temperature: float = 0.0   # 0: greedy
    top_k: int = 0             # 0: no limit
    top_p: float = 1.0         # 1: no limit
    repetition_penalty: float = 1.0
    seed: int | None = None


def apply_repetition_penalty(logits: np.ndarray, previous, penalty: float) -> np.ndarray:
    """Make tokens seen before less likely (CTRL's rule): positive logits are divided by
    the penalty, negative ones multiplied."""
    if penalty == 1.0 or not len(previous):
        return logits
    out = logits.copy()
    seen = np.unique(np.asarray(previous, np.int64))
    vals = out[seen]
    out[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
    return out


def sample(logits: np.ndarray, params: SamplingParams, rng: np.random.Generator,
           previous=()) -> int:
    logits = apply_repetition_penalty(np.asarray(logits, np.float64), previous,
                                      params.repetition_penalty)
    if params.temperature <= 0:
        return int(np.argmax(logits))
    z = logits / params.temperature
    order = np.argsort(-z, kind="stable")
    if params.top_k > 0:
        order = order[: params.top_k]
    z = z[order]
    p = np.exp(z - z.max())
    p /= p.sum()
    if params.top_p < 1.0:
        # the smallest prefix (by probability) whose mass reaches top_p
        keep = int(np.searchsorted(np.cumsum(p), params.top_p) + 1)
        order, p = order[:keep], p[:keep] / p[:keep].sum()
    return int(order[rng.choice(len(order), p=p)])
