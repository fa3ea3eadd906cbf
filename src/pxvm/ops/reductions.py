"""Reductions (reduce.wgsl): sum, max and dot over all elements, argmax (flat or per
row). Two passes for any length: bounded workgroups reduce grid-strided shares, then
one workgroup reduces the partials; both passes are recorded in the same submit.
(Decoding's steps, argmax into a state tensor, are in decoding.py.)"""

from __future__ import annotations

import numpy as np

from ..kernels.ptx import reductions as ptx_reductions
from ..runtime.webgpu.params import KernelParams, kernel_params, u32
from .registry import meta, op, require

KERNEL = "reduce.wgsl"
WG = 256
MAX_GROUPS = 1024
ARGMAX_CHUNK = 4096  # elements per workgroup in the first pass of a flat argmax


@kernel_params(KERNEL)
class ReduceParams(KernelParams):
    n: u32
    row_len: u32
    n_groups: u32
    history: u32


def nonempty(x, name):
    require(int(np.prod(x.shape, dtype=np.int64)) > 0,
            f"{name} of an empty tensor is undefined; pass at least one element")


def _infer_full(x):
    nonempty(x, "reduction")
    return meta((), np.float32)


def _infer_dot(a, b):
    require(len(a.shape) == 1 and len(b.shape) == 1,
            f"dot takes two 1-D vectors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    require(a.shape == b.shape,
            f"dot needs vectors of equal length, got {a.shape[0]} and {b.shape[0]}")
    nonempty(a, "dot")
    return meta((), np.float32)


def _infer_argmax(x, axis=None):
    nonempty(x, "argmax")
    require(axis in (None, -1, len(x.shape) - 1),
            f"argmax supports axis=None (flat) or axis=-1 (last axis), got axis={axis}")
    if axis is None:
        return meta((), np.int32)
    require(x.shape[-1] > 0, "argmax over an empty last axis is undefined")
    return meta(tuple(x.shape[:-1]), np.int32)


def _two_passes(code: int):
    """The WebGPU kernel of a full reduction (OP `code` of reduce.wgsl)."""
    def record(ctx, x, y=None):
        y = x if y is None else y
        n = x.size
        groups = min(MAX_GROUPS, (n + WG - 1) // WG)
        partials = ctx.empty((groups,), np.float32, "reduction partials")
        unused = ctx.empty((1,), np.int32, "unused")
        ctx.dispatch(KERNEL, "partial", [x, y, partials, unused], ReduceParams(n, 0, groups, 0),
                     (groups, 1, 1), {"OP": code})
        out = ctx.empty((), np.float32)
        ctx.dispatch(KERNEL, "finish", [partials, partials, out, unused],
                     ReduceParams(groups, 0, 1, 0), (1, 1, 1), {"OP": 0 if code == 2 else code})
        return out
    return record


def record_flat_argmax(ctx, x, out, advance=False, sampler=None):
    """Record the flat argmax of `x` into `out`[0] (reduce.wgsl's argmax_rows in chunks,
    then argmax_finish); with `advance`, out is a decoding state and `sampler` draws
    (decoding.py)."""
    n = x.size
    chunks = (n + ARGMAX_CHUNK - 1) // ARGMAX_CHUNK
    values = ctx.empty((chunks,), np.float32, "chunk maxima")
    indices = ctx.empty((chunks,), np.int32, "chunk argmax")
    sample = {"SAMPLE": int(sampler is not None)}
    ctx.dispatch(KERNEL, "argmax_rows", [x, x if sampler is None else sampler, values, indices],
                 ReduceParams(n, ARGMAX_CHUNK, 0, 0), chunks, sample)
    if sampler is None:
        sampler = ctx.empty((1,), np.float32, "unused")
    history = out.size - 2 if advance else 0
    ctx.dispatch(KERNEL, "argmax_finish", [values, indices, sampler, out],
                 ReduceParams(chunks, ARGMAX_CHUNK, 0, history), (1, 1, 1),
                 {"ADVANCE": int(advance), **sample})


def _argmax_webgpu(ctx, x, axis=None):
    n = x.size
    if axis is not None:
        row_len = x.shape[-1]
        rows = n // row_len
        values = ctx.empty((rows,), np.float32, "row maxima")
        out = ctx.empty(x.shape[:-1], np.int32)
        ctx.dispatch(KERNEL, "argmax_rows", [x, x, values, out], ReduceParams(n, row_len, 0, 0),
                     rows)
        return out
    out = ctx.empty((), np.int32)
    record_flat_argmax(ctx, x, out)
    return out


def _reduce_cuda(name: str):
    """The CUDA kernel of reduction `name` (pxvm.kernels.ptx.reductions): partial values
    of a block each, then one block over them."""
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


@op(infer=_infer_full, webgpu=_two_passes(0), cuda=_reduce_cuda("sum"))
def sum(x, *, backend="auto"):  # noqa: A001 - numpy's name
    """Sum of all elements (float64 accumulation, returned as f32)."""
    return np.float32(np.sum(np.asarray(x, np.float64)))


@op(infer=_infer_full, webgpu=_two_passes(1), cuda=_reduce_cuda("max"))
def max(x, *, backend="auto"):  # noqa: A001 - numpy's name
    """Largest element; NaN if any element is NaN (numpy semantics)."""
    return np.float32(np.max(np.asarray(x, np.float32)))


@op(infer=_infer_dot, webgpu=_two_passes(2), cuda=_reduce_cuda("dot"))
def dot(a, b, *, backend="auto"):
    """Dot product of two 1-D vectors (float64 accumulation, returned as f32)."""
    return np.float32(np.dot(np.asarray(a, np.float64), np.asarray(b, np.float64)))


@op(infer=_infer_argmax, webgpu=_argmax_webgpu)
def argmax(x, axis=None, *, backend="auto"):
    """numpy.argmax as int32: flat index (axis=None) or per row of the last axis (-1);
    ties pick the first index and the first NaN wins."""
    return np.asarray(np.argmax(np.asarray(x, np.float32), axis=axis), dtype=np.int32)
