"""Copies of rows and columns: `write_rows` stores rows into an existing tensor in place
(a KV cache), `slice_rows` and `slice_columns` take a range of rows or columns into a new
tensor, `concat_columns` joins two matrices side by side.

Each is a few strided copies of rows (`row_copies`), so that a backend implements one
copy of rows and registers it for all four (`register_row_copies`)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .registry import meta, op, require


def _infer_write(dst, src, start=0):
    require(tuple(dst.shape[1:]) == tuple(src.shape[1:]),
            f"write_rows: rows of {tuple(src.shape)} do not match rows of {tuple(dst.shape)}")
    require(0 <= start and start + src.shape[0] <= dst.shape[0],
            f"write_rows: rows {start}..{start + src.shape[0] - 1} are outside the "
            f"{dst.shape[0]} rows of the destination")
    return meta(dst.shape, np.float32)


@op(infer=_infer_write)
def write_rows(dst, src, start=0, *, backend="auto"):
    """dst[start:start + len(src)] = src, in place; returns dst."""
    dst[start: start + src.shape[0]] = src
    return dst


def infer_slice(x, start=0, stop=None):
    stop = x.shape[0] if stop is None else stop
    require(0 <= start < stop <= x.shape[0],
            f"slice_rows: [{start}:{stop}] is not a non-empty range of {x.shape[0]} rows")
    return meta((stop - start, *x.shape[1:]), np.float32)


@op(infer=infer_slice)
def slice_rows(x, start=0, stop=None, *, backend="auto"):
    """x[start:stop] as a new array."""
    return np.array(x[start:stop], dtype=np.float32)


def infer_slice_columns(x, start=0, stop=None):
    require(len(x.shape) == 2, f"slice_columns takes a matrix, got shape {tuple(x.shape)}")
    stop = x.shape[1] if stop is None else stop
    require(0 <= start < stop <= x.shape[1],
            f"slice_columns: [{start}:{stop}] is not a non-empty range of {x.shape[1]} columns")
    return meta((x.shape[0], stop - start), np.float32)


@op(infer=infer_slice_columns)
def slice_columns(x, start=0, stop=None, *, backend="auto"):
    """x[:, start:stop] of a matrix, as a new one."""
    return np.array(np.asarray(x)[:, start:stop], dtype=np.float32)


def _infer_concat(a, b):
    require(len(a.shape) == 2 and len(b.shape) == 2 and a.shape[0] == b.shape[0],
            f"concat_columns takes two matrices with the same rows, got {tuple(a.shape)} "
            f"and {tuple(b.shape)}")
    return meta((a.shape[0], a.shape[1] + b.shape[1]), np.float32)


@op(infer=_infer_concat)
def concat_columns(a, b, *, backend="auto"):
    """[a b]: (M, Na) and (M, Nb) side by side as (M, Na + Nb)."""
    return np.concatenate([np.asarray(a, np.float32), np.asarray(b, np.float32)], axis=1)


@dataclass(frozen=True)
class RowCopy:
    """out[dst_row0 + r, dst_col0 + c] = inputs[source][src_row0 + r, src_col0 + c] for
    r < rows and c < length, the source seen as rows of src_row_len values and the result
    as rows of dst_row_len."""
    source: int
    rows: int
    length: int
    src_row_len: int
    dst_row_len: int
    src_row0: int = 0
    src_col0: int = 0
    dst_row0: int = 0
    dst_col0: int = 0


def _row_len(shape) -> int:
    return int(np.prod(shape[1:], dtype=np.int64))


def row_copies(name: str, shapes: list[tuple], params: dict) -> list[RowCopy]:
    """The row copies that op `name` (one of ROW_COPY_OPS) amounts to for inputs of
    `shapes`, already checked by its infer. They write into a new tensor of the op's shape,
    or into the first input (write_rows)."""
    start = int(params.get("start", 0))
    if name == "write_rows":
        n = _row_len(shapes[1])
        return [RowCopy(1, shapes[1][0], n, n, n, dst_row0=start)]
    if name == "slice_rows":
        stop = shapes[0][0] if params.get("stop") is None else int(params["stop"])
        n = _row_len(shapes[0])
        return [RowCopy(0, stop - start, n, n, n, src_row0=start)]
    if name == "slice_columns":
        rows, cols = shapes[0]
        stop = cols if params.get("stop") is None else int(params["stop"])
        return [RowCopy(0, rows, stop - start, cols, stop - start, src_col0=start)]
    if name == "concat_columns":
        (rows, na), (_, nb) = shapes
        return [RowCopy(0, rows, na, na, na + nb), RowCopy(1, rows, nb, nb, na + nb, dst_col0=na)]
    raise ValueError(f"{name} is not one of the row-copy ops")


#: the ops that are row copies, and whether each writes into its first input
ROW_COPY_OPS = {write_rows: True, slice_rows: False, slice_columns: False,
                concat_columns: False}


def register_row_copies(backend: str, copy_rows) -> None:
    """Register on `backend` a kernel for every op of ROW_COPY_OPS that records the op's
    row_copies with `copy_rows(ctx, inputs, out, copy)`, the backend's copy of rows."""
    for op_, in_place in ROW_COPY_OPS.items():
        def kernel(ctx, *inputs, op_=op_, in_place=in_place, **params):
            out = inputs[0] if in_place else ctx.empty(op_.infer(inputs, params).shape,
                                                       np.float32)
            for copy in row_copies(op_.name, [x.shape for x in inputs], params):
                copy_rows(ctx, inputs, out, copy)
            return out
        op_.kernel(backend)(kernel)
