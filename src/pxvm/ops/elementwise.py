"""Element-wise ops: activations, scale and clip; add, sub, mul, div, maximum and minimum
with numpy broadcasting (f32, i32 and u32; div f32)."""

from __future__ import annotations

import math

import numpy as np

from .registry import meta, op, require, same_shape

#: The most dimensions an element-wise op takes (the kernels' index arithmetic)
MAX_DIMS = 8
NUMERIC = ("f32", "i32", "u32")


def broadcast(a, b):
    """`infer` of the binary ops: numpy's broadcast shape of two tensors of one dtype."""
    require(np.dtype(a.dtype) == np.dtype(b.dtype),
            f"operands have different dtypes {np.dtype(a.dtype)} and {np.dtype(b.dtype)}; "
            "convert one of them first")
    try:
        shape = np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
    except ValueError:
        require(False, f"shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be broadcast "
                       "together (numpy rules: trailing dimensions must match or be 1)")
    require(len(shape) <= MAX_DIMS, f"at most {MAX_DIMS} dimensions are supported")
    return meta(shape, a.dtype)


# ---- references -----------------------------------------------------------------------
# They compute in float64 with formulas free of cancellation, so that they are more
# accurate than any f32 kernel they judge (1 + tanh(u) in float64 is already 0 where the
# true GELU is 1e-16).
FLUSH_BELOW = 1e-30


def flush_subnormals(y) -> np.ndarray:
    """Round to f32 and flush results below 1e-30 to (signed) zero. GPUs may flush
    subnormal intermediates to zero (shading languages allow it), which zeroes results a little above
    the subnormal range too (x / inf for x = -10); no f32 use tells such values from 0."""
    y = np.asarray(y, dtype=np.float32)
    tiny = np.abs(y) < FLUSH_BELOW
    return np.where(tiny, np.copysign(np.float32(0), y), y).astype(np.float32)


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _f64(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


@op(infer=same_shape)
def relu(x, *, backend="auto"):
    """max(x, 0); NaN stays NaN."""
    x = _f32(x)
    return np.where(x < 0, np.float32(0), x)


@op(infer=same_shape)
def leaky_relu(x, alpha=0.01, *, backend="auto"):
    """x if x >= 0 else alpha * x."""
    x = _f32(x)
    return np.where(x < 0, x * np.float32(alpha), x)


@op(infer=same_shape)
def elu(x, alpha=1.0, *, backend="auto"):
    """x if x >= 0 else alpha * (exp(x) - 1)."""
    x = _f64(x)
    return flush_subnormals(np.where(x < 0, alpha * np.expm1(np.minimum(x, 0)), x))


@op(infer=same_shape)
def sigmoid(x, *, backend="auto"):
    """1 / (1 + exp(-x))."""
    with np.errstate(over="ignore"):
        return flush_subnormals(1 / (1 + np.exp(-_f64(x))))


@op(infer=same_shape)
def tanh(x, *, backend="auto"):
    """Hyperbolic tangent."""
    return flush_subnormals(np.tanh(_f64(x)))


@op(infer=same_shape)
def silu(x, *, backend="auto"):
    """x * sigmoid(x), also called swish."""
    x = _f64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return flush_subnormals(x / (1 + np.exp(-x)))


swish = silu


@op(infer=same_shape)
def gelu_tanh(x, *, backend="auto"):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = _f64(x)
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    with np.errstate(over="ignore", invalid="ignore"):
        return flush_subnormals(x / (1 + np.exp(-2 * u)))  # the same function, stably


@op(infer=same_shape)
def gelu(x, *, backend="auto"):
    """GELU, exact erf form: 0.5 x (1 + erf(x / sqrt(2)))."""
    x = _f64(x)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    with np.errstate(invalid="ignore"):  # -inf * 0 = NaN, as the GPU says too
        return flush_subnormals(0.5 * x * erfc(-x / math.sqrt(2)))


@op(infer=same_shape)
def clip(x, lo=-1.0, hi=1.0, *, backend="auto"):
    """min(max(x, lo), hi); NaN stays NaN."""
    return np.clip(_f32(x), np.float32(lo), np.float32(hi))


@op(infer=same_shape)
def scale(x, factor=1.0, *, backend="auto"):
    """x * factor."""
    return _f32(x) * np.float32(factor)


def _binary(a, b, fn):
    with np.errstate(all="ignore"):
        return fn(np.asarray(a), np.asarray(b))


@op(infer=broadcast, dtypes=NUMERIC)
def add(a, b, *, backend="auto"):
    """a + b with numpy broadcasting."""
    return _binary(a, b, np.add)


@op(infer=broadcast, dtypes=NUMERIC)
def sub(a, b, *, backend="auto"):
    """a - b with numpy broadcasting."""
    return _binary(a, b, np.subtract)


@op(infer=broadcast, dtypes=NUMERIC)
def mul(a, b, *, backend="auto"):
    """a * b with numpy broadcasting."""
    return _binary(a, b, np.multiply)


@op(infer=broadcast)
def div(a, b, *, backend="auto"):
    """a / b with numpy broadcasting (f32)."""
    return _binary(a, b, np.divide)


@op(infer=broadcast, dtypes=NUMERIC)
def maximum(a, b, *, backend="auto"):
    """Element-wise maximum with numpy broadcasting; NaN wins."""
    return _binary(a, b, np.maximum)


@op(infer=broadcast, dtypes=NUMERIC)
def minimum(a, b, *, backend="auto"):
    """Element-wise minimum with numpy broadcasting; NaN wins."""
    return _binary(a, b, np.minimum)
