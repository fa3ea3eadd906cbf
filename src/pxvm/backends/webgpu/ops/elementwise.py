"""elementwise.wgsl for pxvm.ops.elementwise: the activations, scale and clip (`unary`),
and the binary ops with numpy broadcasting on f32, i32 and u32 (`binary`)."""

from __future__ import annotations

import numpy as np

from ....ops import elementwise
from ..runtime.params import KernelParams, f32, kernel_params, u32, u32x8

KERNEL = "elementwise.wgsl"
UNARY_CODES = {
    "relu": 0, "leaky_relu": 1, "elu": 2, "sigmoid": 3, "tanh": 4, "silu": 5,
    "gelu_tanh": 6, "gelu": 7, "clip": 8, "scale": 9,
}
BINARY_CODES = {"add": 100, "sub": 101, "mul": 102, "div": 103, "maximum": 104, "minimum": 105}
DTYPE_CODES = {np.dtype(np.float32): 0, np.dtype(np.int32): 1, np.dtype(np.uint32): 2}
MAX_DIMS = elementwise.MAX_DIMS


@kernel_params(KERNEL)
class ElementwiseParams(KernelParams):
    n: u32
    ndim: u32
    alpha: f32
    beta: f32
    shape: u32x8
    a_strides: u32x8
    b_strides: u32x8


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


def _unary(name: str):
    """The kernel of unary op `name`: its parameters (alpha, leaky_relu's; lo and hi,
    clip's) are the kernel's alpha and beta, in the op's order."""
    def record(ctx, x, **params):
        out = ctx.empty(x.shape, x.dtype)
        n = x.size
        if n:
            alpha, beta = [*map(float, params.values()), 0.0, 0.0][:2]
            zeros = (0,) * MAX_DIMS
            ctx.dispatch(KERNEL, "unary", [x, x, out],
                         ElementwiseParams(n, 0, alpha, beta, zeros, zeros, zeros),
                         (n + 255) // 256, {"OP": UNARY_CODES[name]})
        return out
    return record


def _binary(name: str):
    def record(ctx, a, b):
        m = elementwise.broadcast(a, b)
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


for _name in UNARY_CODES:
    getattr(elementwise, _name).kernel("webgpu")(_unary(_name))
for _name in BINARY_CODES:
    getattr(elementwise, _name).kernel("webgpu")(_binary(_name))
