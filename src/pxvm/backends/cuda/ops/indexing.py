"""ptx/elementwise.py's copy_rows for pxvm.ops.indexing (in groups of 4 floats where every
length and column allows)."""

from __future__ import annotations

import numpy as np

from ....ops import indexing
from ..ptx import elementwise as ptx_elementwise


def row_len(shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def copy_rows(ctx, src, dst, rows: int, length: int, src_row0: int = 0, dst_row0: int = 0,
              dst_row_len: int | None = None, dst_col0: int = 0,
              src_row_len: int | None = None, src_col0: int = 0) -> None:
    """dst[dst_row0 + r, dst_col0 + c] = src[src_row0 + r, src_col0 + c] for r < rows,
    c < length; rows of `length` values where no other row length is given."""
    dst_row_len = length if dst_row_len is None else dst_row_len
    src_row_len = length if src_row_len is None else src_row_len
    n = rows * length
    if not n:
        return
    vec = 4 if all(v % 4 == 0 for v in (length, dst_row_len, dst_col0, src_row_len,
                                         src_col0)) else 1
    groups = n // vec
    ctx.launch(ptx_elementwise.copy_rows, (vec,),
               [src, dst, groups, length // vec, src_row0, dst_row0, dst_row_len // vec,
                dst_col0 // vec, src_row_len // vec, src_col0 // vec], ctx.stride_grid(groups))


@indexing.write_rows.kernel("cuda")
def write_rows(ctx, dst, src, start=0):
    copy_rows(ctx, src, dst, src.shape[0], row_len(src.shape), dst_row0=int(start))
    return dst


@indexing.slice_rows.kernel("cuda")
def slice_rows(ctx, x, start=0, stop=None):
    m = indexing.infer_slice(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    copy_rows(ctx, x, out, m.shape[0], row_len(x.shape), src_row0=int(start))
    return out


@indexing.slice_columns.kernel("cuda")
def slice_columns(ctx, x, start=0, stop=None):
    m = indexing.infer_slice_columns(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    copy_rows(ctx, x, out, m.shape[0], m.shape[1], src_row_len=x.shape[1],
              src_col0=int(start))
    return out


@indexing.concat_columns.kernel("cuda")
def concat_columns(ctx, a, b):
    rows, na, nb = a.shape[0], a.shape[1], b.shape[1]
    out = ctx.empty((rows, na + nb), np.float32)
    for src, col0 in ((a, 0), (b, na)):
        copy_rows(ctx, src, out, rows, src.shape[1], dst_row_len=na + nb, dst_col0=col0)
    return out
