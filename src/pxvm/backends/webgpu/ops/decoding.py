"""reduce.wgsl for pxvm.ops.decoding: a step is the flat argmax with the state's update
(and the sampler's noise, when sampling) in its last pass."""

from __future__ import annotations

from ....ops import decoding
from .reductions import flat_argmax


@decoding.greedy_step.kernel("webgpu")
def greedy_step(ctx, logits, state):
    flat_argmax(ctx, logits, state, advance=True)
    return state


@decoding.sample_step.kernel("webgpu")
def sample_step(ctx, logits, state, sampler):
    flat_argmax(ctx, logits, state, advance=True, sampler=sampler)
    return state
