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


def copy_rows(ctx, inputs, out, copy: indexing.RowCopy) -> None:
    """Record one of an op's row copies (pxvm.ops.indexing.RowCopy) into `out`."""
    if copy.rows * copy.length:
        params = CopyParams(copy.rows, copy.length, copy.src_row0, copy.dst_row0,
                            copy.dst_row_len, copy.dst_col0, copy.src_row_len, copy.src_col0)
        ctx.dispatch(KERNEL, "copy_rows", [inputs[copy.source], out], params,
                     (copy.rows * copy.length + 255) // 256)


indexing.register_row_copies("webgpu", copy_rows)
