"""Row copies (copy.wgsl; on CUDA pxvm.kernels.ptx.elementwise.copy_rows): `write_rows`
stores rows into an existing tensor in place (a KV cache), `slice_rows` takes a range of
rows into a new tensor, `concat_columns` joins two matrices side by side."""

from __future__ import annotations

import numpy as np

from ..kernels.ptx import elementwise as ptx_elementwise
from ..runtime.webgpu.params import KernelParams, kernel_params, u32
from .registry import in_place_on_host, meta, op, require

KERNEL = "copy.wgsl"


@kernel_params(KERNEL)
class CopyParams(KernelParams):
    """Copy `rows` rows of `row_len` values from row src_row0 on into a destination of
    rows of `dst_row_len` values, from row dst_row0 and column dst_col0 on."""
    rows: u32
    row_len: u32
    src_row0: u32
    dst_row0: u32
    dst_row_len: u32
    dst_col0: u32


def _row_len(shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def _copy_rows(ctx, src, dst, params: CopyParams) -> None:
    n = params.rows * params.row_len
    if n:
        ctx.dispatch(KERNEL, "copy_rows", [src, dst], params, (n + 255) // 256)


def _copy_rows_cuda(ctx, src, dst, params: CopyParams) -> None:
    """copy_rows.wgsl's copy as pxvm.kernels.ptx.elementwise.copy_rows (in groups of 4
    floats where every length and column allows)."""
    n = params.rows * params.row_len
    if not n:
        return
    vec = 4 if all(v % 4 == 0 for v in (params.row_len, params.dst_row_len,
                                         params.dst_col0)) else 1
    groups = n // vec
    ctx.launch(ptx_elementwise.copy_rows, (vec,),
               [src, dst, groups, params.row_len // vec, params.src_row0, params.dst_row0,
                params.dst_row_len // vec, params.dst_col0 // vec], ctx.stride_grid(groups))


def _infer_write(dst, src, start=0):
    require(tuple(dst.shape[1:]) == tuple(src.shape[1:]),
            f"write_rows: rows of {tuple(src.shape)} do not match rows of {tuple(dst.shape)}")
    require(0 <= start and start + src.shape[0] <= dst.shape[0],
            f"write_rows: rows {start}..{start + src.shape[0] - 1} are outside the "
            f"{dst.shape[0]} rows of the destination")
    return meta(dst.shape, np.float32)


def _write_rows_webgpu(ctx, dst, src, start=0):
    row = _row_len(src.shape)
    _copy_rows(ctx, src, dst, CopyParams(src.shape[0], row, 0, int(start), row, 0))
    return dst


def _write_rows_cuda(ctx, dst, src, start=0):
    row = _row_len(src.shape)
    _copy_rows_cuda(ctx, src, dst, CopyParams(src.shape[0], row, 0, int(start), row, 0))
    return dst


@op(infer=_infer_write, webgpu=_write_rows_webgpu, cuda=_write_rows_cuda)
def write_rows(dst, src, start=0, *, backend="auto"):
    """dst[start:start + len(src)] = src, in place; returns dst."""
    dst[start: start + src.shape[0]] = src
    return dst


in_place_on_host(write_rows, "cpu")


def _infer_slice(x, start=0, stop=None):
    stop = x.shape[0] if stop is None else stop
    require(0 <= start < stop <= x.shape[0],
            f"slice_rows: [{start}:{stop}] is not a non-empty range of {x.shape[0]} rows")
    return meta((stop - start, *x.shape[1:]), np.float32)


def _slice_rows_webgpu(ctx, x, start=0, stop=None):
    m = _infer_slice(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    row = _row_len(x.shape)
    _copy_rows(ctx, x, out, CopyParams(m.shape[0], row, int(start), 0, row, 0))
    return out


def _slice_rows_cuda(ctx, x, start=0, stop=None):
    m = _infer_slice(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    row = _row_len(x.shape)
    _copy_rows_cuda(ctx, x, out, CopyParams(m.shape[0], row, int(start), 0, row, 0))
    return out


@op(infer=_infer_slice, webgpu=_slice_rows_webgpu, cuda=_slice_rows_cuda)
def slice_rows(x, start=0, stop=None, *, backend="auto"):
    """x[start:stop] as a new array."""
    return np.array(x[start:stop], dtype=np.float32)


def _infer_concat(a, b):
    require(len(a.shape) == 2 and len(b.shape) == 2 and a.shape[0] == b.shape[0],
            f"concat_columns takes two matrices with the same rows, got {tuple(a.shape)} "
            f"and {tuple(b.shape)}")
    return meta((a.shape[0], a.shape[1] + b.shape[1]), np.float32)


def _concat_columns_webgpu(ctx, a, b):
    rows, na, nb = a.shape[0], a.shape[1], b.shape[1]
    out = ctx.empty((rows, na + nb), np.float32)
    for src, col0 in ((a, 0), (b, na)):
        _copy_rows(ctx, src, out, CopyParams(rows, src.shape[1], 0, 0, na + nb, col0))
    return out


def _concat_columns_cuda(ctx, a, b):
    rows, na, nb = a.shape[0], a.shape[1], b.shape[1]
    out = ctx.empty((rows, na + nb), np.float32)
    for src, col0 in ((a, 0), (b, na)):
        _copy_rows_cuda(ctx, src, out, CopyParams(rows, src.shape[1], 0, 0, na + nb, col0))
    return out


@op(infer=_infer_concat, webgpu=_concat_columns_webgpu, cuda=_concat_columns_cuda)
def concat_columns(a, b, *, backend="auto"):
    """[a b]: (M, Na) and (M, Nb) side by side as (M, Na + Nb)."""
    return np.concatenate([np.asarray(a, np.float32), np.asarray(b, np.float32)], axis=1)
