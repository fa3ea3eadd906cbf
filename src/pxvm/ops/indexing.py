"""Row copies (copy.wgsl): `write_rows` stores rows into an existing tensor in place (a KV
cache), `slice_rows` takes a range of rows into a new tensor, `concat_columns` joins two
matrices side by side."""

from __future__ import annotations

import numpy as np

from .registry import meta, register, require


def _row_len(shape):
    return int(np.prod(shape[1:], dtype=np.int64))


def write_rows_ref(dst, src, start=0):
    """dst[start:start + len(src)] = src, in place; returns dst."""
    dst[start: start + src.shape[0]] = src
    return dst


def slice_rows_ref(x, start=0, stop=None):
    """x[start:stop] as a new array."""
    return np.array(x[start:stop], dtype=np.float32)


def _infer_write(dst, src, start=0):
    require(tuple(dst.shape[1:]) == tuple(src.shape[1:]),
            f"write_rows: rows of {tuple(src.shape)} do not match rows of {tuple(dst.shape)}")
    require(0 <= start and start + src.shape[0] <= dst.shape[0],
            f"write_rows: rows {start}..{start + src.shape[0] - 1} are outside the "
            f"{dst.shape[0]} rows of the destination")
    return meta(dst.shape, np.float32)


def _infer_slice(x, start=0, stop=None):
    stop = x.shape[0] if stop is None else stop
    require(0 <= start < stop <= x.shape[0],
            f"slice_rows: [{start}:{stop}] is not a non-empty range of {x.shape[0]} rows")
    return meta((stop - start, *x.shape[1:]), np.float32)


def write_rows_gpu(ctx, dst, src, start=0):
    n = src.shape[0] * _row_len(src.shape)
    if n:
        ctx.dispatch("copy.wgsl", "copy_rows", [src, dst],
                     (src.shape[0], _row_len(src.shape), 0, int(start), _row_len(src.shape), 0),
                     (n + 255) // 256)
    return dst


def slice_rows_gpu(ctx, x, start=0, stop=None):
    m = _infer_slice(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    n = m.shape[0] * _row_len(x.shape)
    row = _row_len(x.shape)
    ctx.dispatch("copy.wgsl", "copy_rows", [x, out], (m.shape[0], row, int(start), 0, row, 0),
                 (n + 255) // 256)
    return out


def concat_columns_ref(a, b):
    """[a b]: (M, Na) and (M, Nb) side by side as (M, Na + Nb)."""
    return np.concatenate([np.asarray(a, np.float32), np.asarray(b, np.float32)], axis=1)


def _infer_concat(a, b):
    require(len(a.shape) == 2 and len(b.shape) == 2 and a.shape[0] == b.shape[0],
            f"concat_columns takes two matrices with the same rows, got {tuple(a.shape)} "
            f"and {tuple(b.shape)}")
    return meta((a.shape[0], a.shape[1] + b.shape[1]), np.float32)


def concat_columns_gpu(ctx, a, b):
    rows, na, nb = a.shape[0], a.shape[1], b.shape[1]
    out = ctx.empty((rows, na + nb), np.float32)
    for src, col0 in ((a, 0), (b, na)):
        n = rows * src.shape[1]
        if n:
            ctx.dispatch("copy.wgsl", "copy_rows", [src, out],
                         (rows, src.shape[1], 0, 0, na + nb, col0), (n + 255) // 256)
    return out


write_rows = register("write_rows", 2, write_rows_ref, write_rows_gpu, _infer_write)
slice_rows = register("slice_rows", 1, slice_rows_ref, slice_rows_gpu, _infer_slice)
concat_columns = register("concat_columns", 2, concat_columns_ref, concat_columns_gpu,
                          _infer_concat)
