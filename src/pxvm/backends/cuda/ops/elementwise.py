"""ptx/elementwise.py for pxvm.ops.elementwise, on float32: the activations (all but the
exact GELU), scale and clip, and the binary ops where one operand is the other's size or
repeats over its leading dimensions."""

from __future__ import annotations

import numpy as np

from ....ops import MissingKernelError, elementwise
from ..ptx import elementwise as ptx_elementwise


def float32_only(name: str, *tensors) -> None:
    for t in tensors:
        if np.dtype(t.dtype) != np.float32:
            raise MissingKernelError(f"op {name} has no CUDA kernel for {np.dtype(t.dtype)} "
                                     "yet (float32 only); run it on webgpu, cpu or numpy")


def _unary(name: str):
    """The kernel of unary op `name`: its parameters (alpha, leaky_relu's; lo and hi,
    clip's) are the kernel's alpha and beta, in the op's order."""
    def record(ctx, x, **params):
        float32_only(name, x)
        out = ctx.empty(x.shape, x.dtype)
        n = x.size
        if n:
            vec = 4 if n % 4 == 0 else 1
            alpha, beta = [*map(float, params.values()), 0.0, 0.0][:2]
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


def _binary(name: str):
    def record(ctx, a, b):
        float32_only(name, a, b)
        m = elementwise.broadcast(a, b)
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


def glu(ctx, both, activation: str):
    """act(both[:, :F]) * both[:, F:] for both (M, 2F): a GLU after its product."""
    m, f = both.shape[0], both.shape[1] // 2
    out = ctx.empty((m, f), np.float32)
    vec = 4 if f % 4 == 0 else 1
    groups = m * f // vec
    if groups:
        ctx.launch(ptx_elementwise.glu, (activation, vec), [both, out, groups, f // vec],
                   ctx.stride_grid(groups))
    return out


for _name in ptx_elementwise.UNARY:
    getattr(elementwise, _name).kernel("cuda")(_unary(_name))
for _name in ptx_elementwise.BINARY:
    getattr(elementwise, _name).kernel("cuda")(_binary(_name))
#: a + b (the fused products' residuals, added after their product where not inside it)
add_kernel = elementwise.add.kernels["cuda"]
