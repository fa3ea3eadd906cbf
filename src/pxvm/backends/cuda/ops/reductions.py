"""ptx/reductions.py for pxvm.ops.reductions: partial values of a block each, then one
block over them."""

from __future__ import annotations

import numpy as np

from ....ops import reductions
from ..ptx import decoding as ptx_decoding
from ..ptx import reductions as ptx_reductions


def _two_passes(name: str):
    def record(ctx, a, b=None):
        n = a.size
        blocks = min(ptx_reductions.PARTIALS, -(-n // ptx_reductions.THREADS))
        partial = ctx.empty((blocks,), np.float32)
        out = ctx.empty((), np.float32)
        ctx.launch(ptx_reductions.partials, (name,), [a, a if b is None else b, partial, n],
                   blocks, block=ptx_reductions.THREADS)
        ctx.launch(ptx_reductions.finish, (name,), [partial, out, blocks], 1,
                   block=ptx_reductions.THREADS)
        return out
    return record


for _name in ("sum", "max", "dot"):
    getattr(reductions, _name).kernel("cuda")(_two_passes(_name))


@reductions.argmax.kernel("cuda")
def argmax(ctx, x, axis=None):
    """A block a row (the flat argmax: one row of all elements)."""
    n = x.size if axis is None else x.shape[-1]
    out = ctx.empty(() if axis is None else tuple(x.shape[:-1]), np.int32, "argmax")
    ctx.launch(ptx_decoding.argmax_rows, (), [x, out, n], x.size // n,
               block=ptx_decoding.THREADS)
    return out
