"""Decoding steps: the next token chosen where the logits are and written into a decoding
state [token, position, history...], so that steps chain on the device without the
host. `greedy_step` takes the argmax; `sample_step` the argmax of logits / temperature
plus Gumbel noise from a counter-based hash, a draw from softmax(logits / temperature)
that is the same on every backend. `advance_tokens` does the same for a batch's step
over a paged cache (its token ids and token table)."""

from __future__ import annotations

import numpy as np

from .reductions import argmax, nonempty
from .registry import meta, op, require


def _infer_greedy(logits, state):
    nonempty(logits, "greedy_step")
    require(np.dtype(state.dtype) == np.int32 and len(state.shape) == 1 and state.shape[0] >= 2,
            "greedy_step: state must be a 1-D int32 tensor [token, position, ...]")
    return meta(state.shape, np.int32)


def _infer_sample(logits, state, sampler):
    require(np.dtype(sampler.dtype) == np.float32 and tuple(sampler.shape) == (3,),
            "sample_step: the sampler must be a float32 tensor [temperature, seed, counter]")
    return _infer_greedy(logits, state)


@op(infer=_infer_greedy, input_dtypes=("f32", "i32"))
def greedy_step(logits, state, *, backend="auto"):
    """Greedy decoding's step on a state [token, position, history...] (int32), in place:
    token = argmax(logits) (flat, first maximum), also written to
    history[position % len(history)] when there is a history, then position += 1.
    Returns state. The history keeps the tokens of several steps run back to back."""
    token = argmax.reference(logits)
    state[0] = token
    history = len(state) - 2
    if history > 0:
        state[2 + int(state[1]) % history] = token
    state[1] += 1
    return state


def _pcg_hash(v: np.ndarray) -> np.ndarray:
    """PCG's output hash of uint32 values (the sampling kernels' pcg_hash)."""
    v = np.asarray(v, np.uint32)
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as in the kernels
        state = v * np.uint32(747796405) + np.uint32(2891336453)
        word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def gumbel_noise(seed: int, counter: int, n: int) -> np.ndarray:
    """float32 Gumbel noise -log(-log(u)) for elements 0..n-1, u in (0, 1) from 24 bits of
    hash(seed, counter, index): the noise the sampling step adds on every backend."""
    inner = _pcg_hash(np.uint32(counter) ^ _pcg_hash(np.uint32(seed)))
    h = _pcg_hash(np.arange(n, dtype=np.uint32) ^ inner)
    u = ((h >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 16777216.0)
    return -np.log(-np.log(u))


def sampled_logits(logits, temperature: float, seed: int, counter: int) -> np.ndarray:
    """logits / temperature + Gumbel noise (flat, float32): their argmax is a draw from
    softmax(logits / temperature). Temperature 0: the logits themselves (greedy)."""
    z = np.asarray(logits, np.float32).reshape(-1)
    if temperature <= 0:
        return z
    return z / np.float32(temperature) + gumbel_noise(seed, counter, z.size)


@op(infer=_infer_sample, input_dtypes=("f32", "i32", "f32"))
def sample_step(logits, state, sampler, *, backend="auto"):
    """Sampled decoding's step: as greedy_step on the argmax of
    sampled_logits(logits, temperature, seed, counter) for the sampler [temperature,
    seed, counter] (float32; seed and counter whole numbers below 2^24), whose counter
    then advances by one. Returns state."""
    temperature, seed, counter = (float(v) for v in np.asarray(sampler)[:3])
    greedy_step.reference(sampled_logits(logits, temperature, int(seed), int(counter)), state)
    sampler[2] += 1
    return state


def _infer_advance(token_ids, token_table, tokens):
    n = token_ids.shape[0] if len(token_ids.shape) == 1 else -1
    require(all(np.dtype(t.dtype) == np.int32 for t in (token_ids, token_table, tokens)),
            "advance_tokens: token ids, token table and tokens must be int32")
    require(n > 0 and tuple(token_table.shape) == (n, 2) and tuple(tokens.shape) == (n,),
            f"advance_tokens: needs token ids (n,), a token table (n, 2) and tokens (n,), got "
            f"{tuple(token_ids.shape)}, {tuple(token_table.shape)} and {tuple(tokens.shape)}")
    return meta(token_table.shape, np.int32)


@op(infer=_infer_advance, input_dtypes=("i32", "i32", "i32"))
def advance_tokens(token_ids, token_table, tokens, *, backend="auto"):
    """A batch's decoding step's inputs made the next step's, in place: token i's id
    becomes tokens[i] (the step's choice for it) and its position (token_table[i, 1],
    beside its sequence) one more, so that steps chain on the device without the host.
    Returns token_table."""
    token_ids[:] = tokens
    token_table[:, 1] += 1
    return token_table
