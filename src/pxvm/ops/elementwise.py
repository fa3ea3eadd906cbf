"""Element-wise ops (elementwise.wgsl): activations, scale and clip; add, sub, mul, div,
maximum and minimum with numpy broadcasting."""

from __future__ import annotations

import math

import numpy as np

from .registry import meta, register, require

KERNEL = "elementwise.wgsl"
UNARY_CODES = {
    "relu": 0, "leaky_relu": 1, "elu": 2, "sigmoid": 3, "tanh": 4, "silu": 5,
    "gelu_tanh": 6, "gelu": 7, "clip": 8, "scale": 9,
}
BINARY_CODES = {"add": 100, "sub": 101, "mul": 102, "div": 103, "maximum": 104, "minimum": 105}
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.int32): 1, np.dtype(np.uint32): 2}
MAX_DIMS = 8


# ---- numpy references ----------------------------------------------------------------
def _f32(x):
    return np.asarray(x, dtype=np.float32)


def relu_ref(x):
    """max(x, 0); NaN stays NaN."""
    x = _f32(x)
    return np.where(x < 0, np.float32(0), x)


def leaky_relu_ref(x, alpha=0.01):
    """x if x >= 0 else alpha * x."""
    x = _f32(x)
    return np.where(x < 0, x * np.float32(alpha), x)


def _f64(x):
    return np.asarray(x, dtype=np.float32).astype(np.float64)


FLUSH_BELOW = 1e-30


def flush_subnormals(y) -> np.ndarray:
    """Round to f32 and flush results below 1e-30 to (signed) zero. GPUs may flush
    subnormal intermediates to zero (WGSL allows it), which zeroes results a little above
    the subnormal range too (x / inf for x = -10); no f32 use tells such values from 0."""
    y = np.asarray(y, dtype=np.float32)
    tiny = np.abs(y) < FLUSH_BELOW
    return np.where(tiny, np.copysign(np.float32(0), y), y).astype(np.float32)


# The references compute in float64 with formulas free of cancellation, so that they are
# more accurate than any f32 kernel they judge (1 + tanh(u) in float64 is already 0 where
# the true GELU is 1e-16).
def elu_ref(x, alpha=1.0):
    """x if x >= 0 else alpha * (exp(x) - 1)."""
    x = _f64(x)
    return flush_subnormals(np.where(x < 0, alpha * np.expm1(np.minimum(x, 0)), x))


def sigmoid_ref(x):
    """1 / (1 + exp(-x))."""
    with np.errstate(over="ignore"):
        return flush_subnormals(1 / (1 + np.exp(-_f64(x))))


def tanh_ref(x):
    """Hyperbolic tangent."""
    return flush_subnormals(np.tanh(_f64(x)))


def silu_ref(x):
    """x * sigmoid(x), also called swish."""
    x = _f64(x)
    with np.errstate(over="ignore", invalid="ignore"):
        return flush_subnormals(x / (1 + np.exp(-x)))


def gelu_tanh_ref(x):
    """GELU, tanh approximation: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""
    x = _f64(x)
    u = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    with np.errstate(over="ignore", invalid="ignore"):
        return flush_subnormals(x / (1 + np.exp(-2 * u)))  # the same function, stably


def gelu_ref(x):
    """GELU, exact erf form: 0.5 x (1 + erf(x / sqrt(2)))."""
    x = _f64(x)
    erfc = np.vectorize(math.erfc, otypes=[np.float64])
    with np.errstate(invalid="ignore"):  # -inf * 0 = NaN, as the GPU says too
        return flush_subnormals(0.5 * x * erfc(-x / math.sqrt(2)))


def clip_ref(x, lo=-1.0, hi=1.0):
    """min(max(x, lo), hi); NaN stays NaN."""
    return np.clip(_f32(x), np.float32(lo), np.float32(hi))


def scale_ref(x, factor=1.0):
    """x * factor."""
    return _f32(x) * np.float32(factor)


def _binary_ref(fn):
    def ref(a, b):
        with np.errstate(all="ignore"):
            return fn(np.asarray(a), np.asarray(b))
    ref.__doc__ = f"Element-wise {fn.__name__} with numpy broadcasting."
    return ref


# ---- shapes ---------------------------------------------------------------------------
def _same_shape(x, **params):
    return meta(x.shape, x.dtype)


def _broadcast(a, b):
    require(np.dtype(a.dtype) == np.dtype(b.dtype),
            f"operands have different dtypes {np.dtype(a.dtype)} and {np.dtype(b.dtype)}; "
            "convert one of them first")
    try:
        shape = np.broadcast_shapes(tuple(a.shape), tuple(b.shape))
    except ValueError:
        raise_shape(a, b)
    require(len(shape) <= MAX_DIMS, f"at most {MAX_DIMS} dimensions are supported")
    return meta(shape, a.dtype)


def raise_shape(a, b):
    require(False, f"shapes {tuple(a.shape)} and {tuple(b.shape)} cannot be broadcast together "
                   "(numpy rules: trailing dimensions must match or be 1)")


# ---- GPU ------------------------------------------------------------------------------
def _padded(values, fill=0):
    values = list(values)[-MAX_DIMS:]
    return [fill] * (MAX_DIMS - len(values)) + values


def _strides_for(shape, out_shape):
    """Element strides of a contiguous `shape` broadcast to `out_shape` (0 where broadcast)."""
    shape = (1,) * (len(out_shape) - len(shape)) + tuple(shape)
    strides, acc = [], 1
    for extent in reversed(shape):
        strides.append(0 if extent == 1 else acc)
        acc *= extent
    return list(reversed(strides))


def _unary_gpu(code):
    def gpu(ctx, x, alpha=0.0, beta=0.0):
        out = ctx.empty(x.shape, x.dtype)
        n = x.size
        if n:
            params = (n, 0, float(alpha), float(beta)) + (0,) * (3 * MAX_DIMS)
            ctx.dispatch(KERNEL, "unary", [x, x, out], params, (n + 255) // 256,
                         {"OP": code})
        return out
    return gpu


def _binary_gpu(code):
    def gpu(ctx, a, b):
        m = _broadcast(a, b)
        out = ctx.empty(m.shape, m.dtype)
        n = out.size
        if n == 0:
            return out
        broadcast = tuple(a.shape) != m.shape or tuple(b.shape) != m.shape
        shape = _padded(m.shape, 1)
        params = (n, MAX_DIMS, 0.0, 0.0, *shape,
                  *_padded(_strides_for(a.shape, m.shape)),
                  *_padded(_strides_for(b.shape, m.shape)))
        ctx.dispatch(KERNEL, "binary", [a, b, out], params, (n + 255) // 256,
                     {"OP": code, "DTYPE": DTYPE_CODES[np.dtype(m.dtype)],
                      "BROADCAST": int(broadcast)})
        return out
    return gpu


def _param_unary(name, ref, to_params):
    """Register a unary op whose scalar parameters map to the kernel's alpha/beta."""
    base = _unary_gpu(UNARY_CODES[name])

    def gpu(ctx, x, **params):
        alpha, beta = to_params(**params)
        return base(ctx, x, alpha, beta)

    return register(name, 1, ref, gpu, _same_shape)


relu = _param_unary("relu", relu_ref, lambda: (0.0, 0.0))
leaky_relu = _param_unary("leaky_relu", leaky_relu_ref, lambda alpha: (alpha, 0.0))
elu = _param_unary("elu", elu_ref, lambda alpha: (alpha, 0.0))
sigmoid = _param_unary("sigmoid", sigmoid_ref, lambda: (0.0, 0.0))
tanh = _param_unary("tanh", tanh_ref, lambda: (0.0, 0.0))
silu = _param_unary("silu", silu_ref, lambda: (0.0, 0.0))
swish = silu
gelu_tanh = _param_unary("gelu_tanh", gelu_tanh_ref, lambda: (0.0, 0.0))
gelu = _param_unary("gelu", gelu_ref, lambda: (0.0, 0.0))
clip = _param_unary("clip", clip_ref, lambda lo, hi: (lo, hi))
scale = _param_unary("scale", scale_ref, lambda factor: (factor, 0.0))

_INT_OK = ("f32", "i32", "u32")
add = register("add", 2, _binary_ref(np.add), _binary_gpu(100), _broadcast, _INT_OK)
sub = register("sub", 2, _binary_ref(np.subtract), _binary_gpu(101), _broadcast, _INT_OK)
mul = register("mul", 2, _binary_ref(np.multiply), _binary_gpu(102), _broadcast, _INT_OK)
div = register("div", 2, _binary_ref(np.divide), _binary_gpu(103), _broadcast)
maximum = register("maximum", 2, _binary_ref(np.maximum), _binary_gpu(104), _broadcast, _INT_OK)
minimum = register("minimum", 2, _binary_ref(np.minimum), _binary_gpu(105), _broadcast, _INT_OK)
