"""reduce.wgsl for pxvm.ops.decoding: a step is the flat argmax with the state's update
(and the sampler's noise, when sampling) in its last pass; decoding.wgsl advances a
batch's step over a paged cache."""

from __future__ import annotations

from ....ops import decoding
from ..runtime.params import KernelParams, kernel_params, u32
from .reductions import flat_argmax

KERNEL = "decoding.wgsl"
WG = 64


@kernel_params(KERNEL)
class AdvanceParams(KernelParams):
    n: u32


@decoding.greedy_step.kernel("webgpu")
def greedy_step(ctx, logits, state):
    flat_argmax(ctx, logits, state, advance=True)
    return state


@decoding.sample_step.kernel("webgpu")
def sample_step(ctx, logits, state, sampler):
    flat_argmax(ctx, logits, state, advance=True, sampler=sampler)
    return state


@decoding.advance_tokens.kernel("webgpu")
def advance_tokens(ctx, token_ids, token_table, tokens):
    n = token_ids.size
    ctx.dispatch(KERNEL, "advance_tokens", [token_ids, token_table, tokens], AdvanceParams(n),
                 (n + WG - 1) // WG)
    return token_table
