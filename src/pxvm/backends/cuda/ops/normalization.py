"""ptx/rows.py for pxvm.ops.normalization: a block a row for softmax, log_softmax,
rmsnorm and layer_norm (rows of a few KiB cached in shared memory), a thread a rotated
pair for rope."""

from __future__ import annotations

import numpy as np

from ....ops import normalization
from ....ops.normalization import row_count, rope_table
from ..ptx import rows as ptx_rows


def _row_vec(x) -> int:
    return 4 if x.shape[-1] % 4 == 0 else 1


def _softmax(log: bool):
    def record(ctx, x):
        out = ctx.empty(x.shape, np.float32)
        vec = _row_vec(x)
        ctx.launch(ptx_rows.softmax, (log, vec), [x, out, x.shape[-1] // vec], row_count(x),
                   block=ptx_rows.THREADS)
        return out
    return record


normalization.softmax.kernel("cuda")(_softmax(log=False))
normalization.log_softmax.kernel("cuda")(_softmax(log=True))


@normalization.rmsnorm.kernel("cuda")
def rmsnorm(ctx, x, weight, eps=1e-6, half: bool = False):
    """rmsnorm; `half`: the result in float16 (for a prompt's tensor-core product,
    ops/transformer.py)."""
    out = ctx.empty(x.shape, np.float16 if half else np.float32)
    vec, row_bytes = _row_vec(x), 4 * x.shape[-1]
    cached = row_bytes <= ptx_rows.MAX_CACHED_ROW_BYTES
    ctx.launch(ptx_rows.rmsnorm, (vec, cached, half), [x, weight, out, x.shape[-1] // vec,
                                                       eps],
               row_count(x), block=ptx_rows.THREADS, shared_bytes=row_bytes if cached else 0)
    return out


@normalization.layer_norm.kernel("cuda")
def layer_norm(ctx, x, weight, bias, eps=1e-5):
    out = ctx.empty(x.shape, np.float32)
    vec = _row_vec(x)
    ctx.launch(ptx_rows.layer_norm, (vec,), [x, weight, bias, out, x.shape[-1] // vec, eps],
               row_count(x), block=ptx_rows.THREADS)
    return out


@normalization.rope.kernel("cuda")
def rope(ctx, x, pos_offset=0, theta=10000.0, style="interleaved", freq_factors=None,
         attn_factor=1.0):
    seq, heads, d = x.shape
    out = ctx.empty(x.shape, np.float32)
    table = rope_table(ctx, theta, d, int(pos_offset) + seq, freq_factors, attn_factor)
    pairs = seq * heads * (d // 2)
    if pairs:
        ctx.launch(ptx_rows.rope, (style == "neox",),
                   [x, table, out, pairs, heads, d // 2, int(pos_offset)], ctx.stride_grid(pairs))
    return out
