"""reduce.wgsl for pxvm.ops.reductions. Two passes for any length: bounded workgroups
reduce grid-strided shares, then one workgroup reduces the partials; both passes are
recorded in the same submit. `flat_argmax` also makes decoding's steps (decoding.py)."""

from __future__ import annotations

import numpy as np

from ....ops import reductions
from ..runtime.params import KernelParams, kernel_params, u32

KERNEL = "reduce.wgsl"
WG = 256
MAX_GROUPS = 1024
ARGMAX_CHUNK = 4096  # elements per workgroup in the first pass of a flat argmax


@kernel_params(KERNEL)
class ReduceParams(KernelParams):
    n: u32
    row_len: u32
    n_groups: u32
    history: u32


def _two_passes(code: int):
    """The kernel of a full reduction (OP `code` of reduce.wgsl)."""
    def record(ctx, x, y=None):
        y = x if y is None else y
        n = x.size
        groups = min(MAX_GROUPS, (n + WG - 1) // WG)
        partials = ctx.empty((groups,), np.float32, "reduction partials")
        unused = ctx.empty((1,), np.int32, "unused")
        ctx.dispatch(KERNEL, "partial", [x, y, partials, unused], ReduceParams(n, 0, groups, 0),
                     (groups, 1, 1), {"OP": code})
        out = ctx.empty((), np.float32)
        ctx.dispatch(KERNEL, "finish", [partials, partials, out, unused],
                     ReduceParams(groups, 0, 1, 0), (1, 1, 1), {"OP": 0 if code == 2 else code})
        return out
    return record


reductions.sum.kernel("webgpu")(_two_passes(0))
reductions.max.kernel("webgpu")(_two_passes(1))
reductions.dot.kernel("webgpu")(_two_passes(2))


def flat_argmax(ctx, x, out, advance=False, sampler=None):
    """Record the flat argmax of `x` into `out`[0] (argmax_rows in chunks, then
    argmax_finish); with `advance`, out is a decoding state and `sampler` draws."""
    n = x.size
    chunks = (n + ARGMAX_CHUNK - 1) // ARGMAX_CHUNK
    values = ctx.empty((chunks,), np.float32, "chunk maxima")
    indices = ctx.empty((chunks,), np.int32, "chunk argmax")
    sample = {"SAMPLE": int(sampler is not None)}
    ctx.dispatch(KERNEL, "argmax_rows", [x, x if sampler is None else sampler, values, indices],
                 ReduceParams(n, ARGMAX_CHUNK, 0, 0), chunks, sample)
    if sampler is None:
        sampler = ctx.empty((1,), np.float32, "unused")
    history = out.size - 2 if advance else 0
    ctx.dispatch(KERNEL, "argmax_finish", [values, indices, sampler, out],
                 ReduceParams(chunks, ARGMAX_CHUNK, 0, history), (1, 1, 1),
                 {"ADVANCE": int(advance), **sample})


@reductions.argmax.kernel("webgpu")
def argmax(ctx, x, axis=None):
    n = x.size
    if axis is not None:
        row_len = x.shape[-1]
        rows = n // row_len
        values = ctx.empty((rows,), np.float32, "row maxima")
        out = ctx.empty(x.shape[:-1], np.int32)
        ctx.dispatch(KERNEL, "argmax_rows", [x, x, values, out], ReduceParams(n, row_len, 0, 0),
                     rows)
        return out
    out = ctx.empty((), np.int32)
    flat_argmax(ctx, x, out)
    return out
