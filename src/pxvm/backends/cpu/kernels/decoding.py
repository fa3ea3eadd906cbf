"""Greedy decoding's step on the CPU: the argmax of the logits written into the decoding
state, as pxvm.ops.decoding.greedy_step's reference does (first maximum, a NaN wins),
without its numpy overhead on every decoded token."""

from __future__ import annotations

import numba
import numpy as np


@numba.njit(cache=True, nogil=True)
def greedy_step(logits, state):
    """state = [argmax(logits), position + 1, history with the token at position]."""
    flat = logits.reshape(-1)
    token = 0
    top = flat[0]
    if not np.isnan(top):
        for i in range(1, flat.size):
            v = flat[i]
            if np.isnan(v):
                token = i
                break
            if v > top:
                top = v
                token = i
    state[0] = token
    history = state.size - 2
    if history > 0:
        state[2 + state[1] % history] = token
    state[1] += 1
