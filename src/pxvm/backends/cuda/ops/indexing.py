"""ptx/elementwise.py's copy_rows for pxvm.ops.indexing (in groups of 4 floats where every
length and column allows)."""

from __future__ import annotations

import numpy as np

from ....ops import indexing
from ..ptx import elementwise as ptx_elementwise


def copy_rows(ctx, inputs, out, copy: indexing.RowCopy) -> None:
    """Launch one of an op's row copies (pxvm.ops.indexing.RowCopy) into `out`."""
    n = copy.rows * copy.length
    if not n:
        return
    vec = 4 if all(v % 4 == 0 for v in (copy.length, copy.dst_row_len, copy.dst_col0,
                                         copy.src_row_len, copy.src_col0)) else 1
    groups = n // vec
    ctx.launch(ptx_elementwise.copy_rows, (vec,),
               [inputs[copy.source], out, groups, copy.length // vec, copy.src_row0,
                copy.dst_row0, copy.dst_row_len // vec, copy.dst_col0 // vec,
                copy.src_row_len // vec, copy.src_col0 // vec], ctx.stride_grid(groups))


indexing.register_row_copies("cuda", copy_rows)
