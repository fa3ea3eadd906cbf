"""Row copies (copy.wgsl): `write_rows` stores rows into an existing tensor in place (a KV
cache), `slice_rows` takes a range of rows into a new tensor."""

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
                     (src.shape[0], _row_len(src.shape), 0, int(start)), (n + 255) // 256)
    return dst


def slice_rows_gpu(ctx, x, start=0, stop=None):
    m = _infer_slice(x, start, stop)
    out = ctx.empty(m.shape, np.float32)
    n = m.shape[0] * _row_len(x.shape)
    ctx.dispatch("copy.wgsl", "copy_rows", [x, out], (m.shape[0], _row_len(x.shape), int(start), 0),
                 (n + 255) // 256)
    return out


write_rows = register("write_rows", 2, write_rows_ref, write_rows_gpu, _infer_write)
slice_rows = register("slice_rows", 1, slice_rows_ref, slice_rows_gpu, _infer_slice)
