"""conv2d.wgsl for pxvm.ops.convolution: a thread an output; convolve2d is conv2d with the
kernel flipped (FLIP)."""

from __future__ import annotations

import numpy as np

from ....core import Tensor
from ....ops import convolution
from ..runtime.params import KernelParams, kernel_params, u32


@kernel_params("conv2d.wgsl")
class Conv2dParams(KernelParams):
    c_in: u32
    h: u32
    w: u32
    c_out: u32
    kh: u32
    kw: u32
    h_out: u32
    w_out: u32
    stride: u32
    padding: u32
    has_bias: u32


def _record_conv(ctx, x, w, bias, stride, padding, flip):
    m = convolution.infer_conv2d(x, w, bias, stride, padding)
    out = ctx.empty(m.shape, np.float32)
    if bias is None:
        bias_t = w  # never read when has_bias = 0; saves a second kernel
    else:
        # bias is a parameter, not an op input, so it may arrive as numpy or as a tensor
        # of either backend; only one already on this device is bound as it is.
        on_device = isinstance(bias, Tensor) and bias.backend is ctx.backend
        bias_t = bias if on_device else ctx.tensor(np.asarray(bias, np.float32).reshape(-1))
    c_out, h_out, w_out = m.shape
    params = Conv2dParams(x.shape[0], x.shape[1], x.shape[2], c_out, w.shape[2], w.shape[3],
                          h_out, w_out, int(stride), int(padding), int(bias is not None))
    n = c_out * h_out * w_out
    ctx.dispatch("conv2d.wgsl", "main", [x, w, bias_t, out], params, (n + 255) // 256,
                 {"FLIP": int(flip)})
    return out


@convolution.conv2d.kernel("webgpu")
def conv2d(ctx, x, w, bias=None, stride=1, padding=0):
    return _record_conv(ctx, x, w, bias, stride, padding, flip=False)


@convolution.convolve2d.kernel("webgpu")
def convolve2d(ctx, image, kernel):
    out = _record_conv(ctx, image.reshape(1, *image.shape), kernel.reshape(1, 1, *kernel.shape),
                       None, 1, 0, flip=True)
    return out.reshape(out.shape[1:])
