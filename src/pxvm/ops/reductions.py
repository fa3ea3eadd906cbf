"""Reductions: sum, max and dot over all elements, argmax (flat or per row).
(Decoding's steps, argmax into a state tensor, are in decoding.py.)"""

from __future__ import annotations

import numpy as np

from .registry import meta, op, require


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


@op(infer=_infer_full)
def sum(x, *, backend="auto"):  # noqa: A001 - numpy's name
    """Sum of all elements (float64 accumulation, returned as f32)."""
    return np.float32(np.sum(np.asarray(x, np.float64)))


@op(infer=_infer_full)
def max(x, *, backend="auto"):  # noqa: A001 - numpy's name
    """Largest element; NaN if any element is NaN (numpy semantics)."""
    return np.float32(np.max(np.asarray(x, np.float32)))


@op(infer=_infer_dot)
def dot(a, b, *, backend="auto"):
    """Dot product of two 1-D vectors (float64 accumulation, returned as f32)."""
    return np.float32(np.dot(np.asarray(a, np.float64), np.asarray(b, np.float64)))


@op(infer=_infer_argmax)
def argmax(x, axis=None, *, backend="auto"):
    """numpy.argmax as int32: flat index (axis=None) or per row of the last axis (-1);
    ties pick the first index and the first NaN wins."""
    return np.asarray(np.argmax(np.asarray(x, np.float32), axis=axis), dtype=np.int32)
