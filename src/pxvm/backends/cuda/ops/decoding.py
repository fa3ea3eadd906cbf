"""ptx/decoding.py for pxvm.ops.decoding: the chunks' best, then the state's token (and
the sampler's counter, when sampling)."""

from __future__ import annotations

import numpy as np

from ....ops import decoding
from ..ptx import decoding as ptx_decoding


def _argmax_step(ctx, logits, state, sampler=None):
    sample = sampler is not None
    chunks = -(-logits.size // ptx_decoding.CHUNK)
    values = ctx.empty((chunks,), np.float32, "chunk maxima")
    indices = ctx.empty((chunks,), np.int32, "chunk argmax")
    sampler = logits if sampler is None else sampler  # unread without SAMPLE
    threads = ptx_decoding.THREADS
    ctx.launch(ptx_decoding.argmax_chunks, (sample,),
               [logits, sampler, values, indices, logits.size], chunks, block=threads)
    ctx.launch(ptx_decoding.argmax_finish, (sample,),
               [values, indices, state, sampler, chunks, state.size - 2], 1, block=threads)
    return state


@decoding.greedy_step.kernel("cuda")
def greedy_step(ctx, logits, state):
    return _argmax_step(ctx, logits, state)


@decoding.sample_step.kernel("cuda")
def sample_step(ctx, logits, state, sampler):
    return _argmax_step(ctx, logits, state, sampler)


@decoding.advance_tokens.kernel("cuda")
def advance_tokens(ctx, token_ids, token_table, tokens):
    n = token_ids.size
    ctx.launch(ptx_decoding.advance_tokens, (), [token_ids, token_table, tokens, n],
               -(-n // ptx_decoding.THREADS), block=ptx_decoding.THREADS)
    return token_table
