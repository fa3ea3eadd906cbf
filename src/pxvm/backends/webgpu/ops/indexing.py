"""copy.wgsl for pxvm.ops.indexing: every row copy is one dispatch of `copy_rows`."""

from __future__ import annotations

import numpy as np

from ....ops import indexing
from ..runtime.params import KernelParams, kernel_params, u32

KERNEL = "copy.wgsl"


@kernel_params(KERNEL)
class CopyParams(KernelParams):
    """Copy `rows` rows of `row_len` values from row src_row0 and column src_col0 on of a
    source of rows of `src_row_len` values into a destination of rows of `dst_row_len`
    values, from row dst_row0 and column dst_col0 on."""
    rows: u32
    row_len: u32
    src_row0: u32
    dst_row0: u32
    dst_row_len: u32
    dst_col0: u32
    src_row_len: u32
    src_col0: u32


def row_len(shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def copy_rows(ctx, src, dst, rows: int, length: int, src_row0: int = 0, dst_row0: int = 0,
              dst_row_len: int | None = None, dst_col0: int = 0,
              src_row_len: int | None = None, src_col0: int = 0) -> None:
    """dst[dst_row0 + r, dst_col0 + c] = src[src_row0 + r, src_col0 + c] for r < rows,
    c < length; rows of `length` values where no other row length is given."""
    n = rows * length
    if n:
        params = CopyParams(rows, length, src_row0, dst_row0,
                            length if dst_row_len is None else dst_row_len, dst_col0,
                            length if src_row_len is None else src_row_len, src_col0)
        ctx.dispatch(KERNEL, "copy_rows", [src, dst], params, (n + 255) // 256)


@indexing.write_rows.kernel("webgpu")
def write_rows(ctx, dst, src, start=0):
    copy_rows(ctx, src, dst, src.shape[0], row_len(src.shape), dst_row0=int(start))
    return dst


@indexing.slice_rows.kernel("webgpu")
def slice_rows(ctx, x, start=0, stop=None):
    m = indexing.infer_slice(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    copy_rows(ctx, x, out, m.shape[0], row_len(x.shape), src_row0=int(start))
    return out


@indexing.slice_columns.kernel("webgpu")
def slice_columns(ctx, x, start=0, stop=None):
    m = indexing.infer_slice_columns(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    copy_rows(ctx, x, out, m.shape[0], m.shape[1], src_row_len=x.shape[1],
              src_col0=int(start))
    return out


@indexing.concat_columns.kernel("webgpu")
def concat_columns(ctx, a, b):
    rows, na, nb = a.shape[0], a.shape[1], b.shape[1]
    out = ctx.empty((rows, na + nb), np.float32)
    for src, col0 in ((a, 0), (b, na)):
        copy_rows(ctx, src, out, rows, src.shape[1], dst_row_len=na + nb, dst_col0=col0)
    return out
