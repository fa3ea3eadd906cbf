"""Element-wise ops (elementwise.wgsl; on CUDA pxvm.kernels.ptx.elementwise): activations,
scale and clip; add, sub, mul, div, maximum and minimum with numpy broadcasting."""

from __future__ import annotations

import math

import numpy as np

from ..kernels.ptx import elementwise as ptx_elementwise
from ..runtime.webgpu.params import KernelParams, f32, kernel_params, u32, u32x8
from .registry import MissingKernelError, meta, op, require, same_shape

KERNEL = "elementwise.wgsl"
UNARY_CODES = {
    "relu": 0, "leaky_relu": 1, "elu": 2, "sigmoid": 3, "tanh": 4, "silu": 5,
    "gelu_tanh": 6, "gelu": 7, "clip": 8, "scale": 9,
}
BINARY_CODES = {"add": 100, "sub": 101, "mul": 102, "div": 103, "maximum": 104, "minimum": 105}
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.int32): 1, np.dtype(np.uint32): 2}
MAX_DIMS = 8
NUMERIC = ("f32", "i32", "u32")


@kernel_params(KERNEL)
class ElementwiseParams(KernelParams):
    n: u32
    ndim: u32
    alpha: f32
    beta: f32
    shape: u32x8
    a_strides: u32x8
    b_strides: u32x8


# ---- WebGPU kernels -------------------------------------------------------------------
def _padded(values, fill=0) -> tuple:
    values = list(values)[-MAX_DIMS:]
    return tuple([fill] * (MAX_DIMS - len(values)) + values)


def _strides_for(shape, out_shape):
    """Element strides of a contiguous `shape` broadcast to `out_shape` (0 where broadcast)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(0 if extent == 1 else acc)
        acc *= extent
    return list(reversed(strides))


def _unary_webgpu(name: str, scalars=lambda **params: (0.0, 0.0)):
    """The kernel of unary op `name`; `scalars(**params)` gives the kernel's alpha, beta."""
    def record(ctx, x, **params):
        out = ctx.empty(x.shape, x.dtype)
        n = x.size
        if n:
            alpha, beta = scalars(**params)
            zeros = (0,) * MAX_DIMS
            ctx.dispatch(KERNEL, "unary", [x, x, out],
                         ElementwiseParams(n, 0, float(alpha), float(beta), zeros, zeros, zeros),
                         (n + 255) // 256, {"OP": UNARY_CODES[name]})
        return out
    return record


def _binary_webgpu(name: str):
    def record(ctx, a, b):
        m = _broadcast(a, b)
        out = ctx.empty(m.shape, m.dtype)
        n = out.size
        if n == 0:
            return out
        broadcast = tuple(a.shape) != m.shape or tuple(b.shape) != m.shape
        params = ElementwiseParams(n, MAX_DIMS, 0.0, 0.0, _padded(m.shape, 1),
                                   _padded(_strides_for(a.shape, m.shape)),
                                   _padded(_strides_for(b.shape, m.shape)))
        ctx.dispatch(KERNEL, "binary", [a, b, out], params, (n + 255) // 256,
                     {"OP": BINARY_CODES[name], "DTYPE": DTYPE_CODES[np.dtype(m.dtype)],
                      "BROADCAST": int(broadcast)})
        return out
    return record


def _broadcast(a, b):
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


# ---- CUDA kernels (pxvm.kernels.ptx.elementwise) ------------------------------------------
def _float32_only(name: str, *tensors) -> None:
    for t in tensors:
        if np.dtype(t.dtype) != np.float32:
            raise MissingKernelError(f"op {name} has no CUDA kernel for {np.dtype(t.dtype)} "
                                     "yet (float32 only); run it on webgpu, cpu or numpy")


def _unary_cuda(name: str, scalars=lambda **params: (0.0, 0.0)):
    def record(ctx, x, **params):
        _float32_only(name, x)
        out = ctx.empty(x.shape, x.dtype)
        n = x.size
        if n:
            vec = 4 if n % 4 == 0 else 1
            alpha, beta = scalars(**params)
            ctx.launch(ptx_elementwise.unary, (name, vec),
                       [x, out, n // vec, alpha, beta], ctx.stride_grid(n // vec))
        return out
    return record


def _repeats(small, shape) -> bool:
    """Whether `small`, leading 1s dropped, is the trailing dimensions of `shape` (it
    repeats over the leading ones, as a row of biases over a matrix)."""
    dims = list(small.shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return tuple(dims) == tuple(shape[len(shape) - len(dims):]) if dims else True


def _binary_cuda(name: str):
    def record(ctx, a, b):
        _float32_only(name, a, b)
        m = _broadcast(a, b)
        out = ctx.empty(m.shape, m.dtype)
        n = out.size
        if n == 0:
            return out
        if a.size == n and b.size == n:
            mode, m_size = "none", n
        elif a.size == n and _repeats(b, m.shape):
            mode, m_size = "b", b.size
        elif b.size == n and _repeats(a, m.shape):
            mode, m_size = "a", a.size
        else:
            raise MissingKernelError(
                f"op {name} on CUDA broadcasts one operand over the other's leading "
                f"dimensions only, not {tuple(a.shape)} with {tuple(b.shape)} yet; run it "
                "on webgpu, cpu or numpy")
        vec = 4 if n % 4 == 0 and m_size % 4 == 0 else 1
        ctx.launch(ptx_elementwise.binary, (name, mode, vec),
                   [a, b, out, n // vec, m_size // vec], ctx.stride_grid(n // vec))
        return out
    return record


def _unary_kernels(name: str, scalars=lambda **params: (0.0, 0.0)) -> dict:
    """Unary op `name`'s kernels by backend (`scalars(**params)`: the kernels' alpha,
    beta)."""
    kernels = {"webgpu": _unary_webgpu(name, scalars)}
    if name in ptx_elementwise.UNARY:
        kernels["cuda"] = _unary_cuda(name, scalars)
    return kernels


def _binary_kernels(name: str) -> dict:
    return {"webgpu": _binary_webgpu(name), "cuda": _binary_cuda(name)}


# ---- references -----------------------------------------------------------------------
# They compute in float64 with formulas free of cancellation, so that they are more
# accurate than any f32 kernel they judge (1 + tanh(u) in float64 is already 0 where the
# true GELU is 1e-16).
FLUSH_BELOW = 1e-30


def flush_subnormals(y) -> np.ndarray:
    """Round to f32 and flush results below 1e-30 to (signed) zero. GPUs may flush
    subnormal intermediates to zero (WGSL allows it), which zeroes results a little above
    the subnormal range too (x / inf for x = -10); no f32 use tells such values from 0."""
    y = np.asarray(y, dtype=np.float32)
    tiny = np.abs(y) < FLUSH_BELOW
    return np.where(tiny, np.copysign(np.float32(0), y), y).astype(np.float32)


def _f32(x):
    return np.asarray(x, dtype=np.float32)


def _f64(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


@op(infer=same_shape, **_unary_kernels("relu"))
def relu(x, *, backend="auto"):
    """max(x, 0); NaN stays NaN."""
    x = _f32(x)
    return np.where(x < 0, np.float32(0), x)


@op(infer=same_shape, **_unary_kernels("leaky_relu", lambda alpha: (alpha, 0.0)))
def leaky_relu(x, alpha=0.01, *, backend="auto"):
    """x if x >= 0 else alpha * x."""
    x = _f32(x)
    return np.where(x < 0, x * np.float32(alpha), x)


@op(infer=same_shape, **_unary_kernels("elu", lambda alpha: (alpha, 0.0)))
def elu(x, alpha=1.0, *, backend="auto"):
    """x if x >= 0 else alpha * (exp(x) - 1)."""
    x = _f64(x)
    return flush_subnormals(np.where(x < 0, alpha * np.expm1(np.minimum(x, 0)), x))


@op(infer=same_shape, **_unary_kernels("sigmoid"))
def sigmoid(x, *, backend="auto"):
    """1 / (1 + exp(-x))."""
    with np.errstate(over="ignore"):
        return flush_subnormals(1 / (1 + np.exp(-_f64(x))))


@op(infer=same_shape, **_unary_kernels("tanh"))
def tanh(x, *, backend="auto"):
    """Hyperbolic tangent."""
    return flush_subnormals(np.tanh(_f64(x)))


@op(infer=same_shape, **_unary_kernels("silu"))
def silu(x, *, backend="auto"):
    """x * sigmoid(x), also called swish."""
    x = _f64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return flush_subnormals(x / (1 + np.exp(-x)))


swish = silu


@op(infer=same_shape, **_unary_kernels("gelu_tanh"))
def gelu_tanh(x, *, backend="auto"):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = _f64(x)
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    with np.errstate(over="ignore", invalid="ignore"):
        return flush_subnormals(x / (1 + np.exp(-2 * u)))  # the same function, stably


@op(infer=same_shape, **_unary_kernels("gelu"))
def gelu(x, *, backend="auto"):
    """GELU, exact erf form: 0.5 x (1 + erf(x / sqrt(2)))."""
    x = _f64(x)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    with np.errstate(invalid="ignore"):  # -inf * 0 = NaN, as the GPU says too
        return flush_subnormals(0.5 * x * erfc(-x / math.sqrt(2)))


@op(infer=same_shape, **_unary_kernels("clip", lambda lo, hi: (lo, hi)))
def clip(x, lo=-1.0, hi=1.0, *, backend="auto"):
    """min(max(x, lo), hi); NaN stays NaN."""
    return np.clip(_f32(x), np.float32(lo), np.float32(hi))


@op(infer=same_shape, **_unary_kernels("scale", lambda factor: (factor, 0.0)))
def scale(x, factor=1.0, *, backend="auto"):
    """x * factor."""
    return _f32(x) * np.float32(factor)


def _binary(a, b, fn):
    with np.errstate(all="ignore"):
        return fn(np.asarray(a), np.asarray(b))


@op(infer=_broadcast, dtypes=NUMERIC, **_binary_kernels("add"))
def add(a, b, *, backend="auto"):
    """a + b with numpy broadcasting."""
    return _binary(a, b, np.add)


@op(infer=_broadcast, dtypes=NUMERIC, **_binary_kernels("sub"))
def sub(a, b, *, backend="auto"):
    """a - b with numpy broadcasting."""
    return _binary(a, b, np.subtract)


@op(infer=_broadcast, dtypes=NUMERIC, **_binary_kernels("mul"))
def mul(a, b, *, backend="auto"):
    """a * b with numpy broadcasting."""
    return _binary(a, b, np.multiply)


@op(infer=_broadcast, **_binary_kernels("div"))
def div(a, b, *, backend="auto"):
    """a / b with numpy broadcasting (f32)."""
    return _binary(a, b, np.divide)


@op(infer=_broadcast, dtypes=NUMERIC, **_binary_kernels("maximum"))
def maximum(a, b, *, backend="auto"):
    """Element-wise maximum with numpy broadcasting; NaN wins."""
    return _binary(a, b, np.maximum)


@op(infer=_broadcast, dtypes=NUMERIC, **_binary_kernels("minimum"))
def minimum(a, b, *, backend="auto"):
    """Element-wise minimum with numpy broadcasting; NaN wins."""
    return _binary(a, b, np.minimum)
