"""softmax.wgsl, norm.wgsl and rope.wgsl for pxvm.ops.normalization: a workgroup a row
for softmax, log_softmax, rmsnorm and layer_norm; a thread a rotated pair for rope."""

from __future__ import annotations

import numpy as np

from ....ops import normalization
from ....ops.normalization import row_count, rope_table
from ..runtime.params import KernelParams, f32, kernel_params, u32


@kernel_params("softmax.wgsl")
class SoftmaxParams(KernelParams):
    rows: u32
    row_len: u32


@kernel_params("norm.wgsl")
class NormParams(KernelParams):
    rows: u32
    row_len: u32
    eps: f32


@kernel_params("rope.wgsl")
class RopeParams(KernelParams):
    seq: u32
    heads: u32
    head_dim: u32
    pos_offset: u32


def _softmax(log: bool):
    def record(ctx, x):
        out = ctx.empty(x.shape, np.float32)
        rows = row_count(x)
        ctx.dispatch("softmax.wgsl", "main", [x, out], SoftmaxParams(rows, x.shape[-1]), rows,
                     {"LOG": int(log)})
        return out
    return record


normalization.softmax.kernel("webgpu")(_softmax(log=False))
normalization.log_softmax.kernel("webgpu")(_softmax(log=True))


@normalization.rmsnorm.kernel("webgpu")
def rmsnorm(ctx, x, weight, eps=1e-6):
    out = ctx.empty(x.shape, np.float32)
    rows = row_count(x)
    ctx.dispatch("norm.wgsl", "rmsnorm", [x, weight, weight, out],
                 NormParams(rows, x.shape[-1], float(eps)), rows)
    return out


@normalization.layer_norm.kernel("webgpu")
def layer_norm(ctx, x, weight, bias, eps=1e-5):
    out = ctx.empty(x.shape, np.float32)
    rows = row_count(x)
    ctx.dispatch("norm.wgsl", "layer_norm", [x, weight, bias, out],
                 NormParams(rows, x.shape[-1], float(eps)), rows)
    return out


@normalization.rope.kernel("webgpu")
def rope(ctx, x, pos_offset=0, theta=10000.0, style="interleaved", freq_factors=None,
         attn_factor=1.0):
    seq, heads, d = x.shape
    out = ctx.empty(x.shape, np.float32)
    table = rope_table(ctx, theta, d, int(pos_offset) + seq, freq_factors, attn_factor)
    pairs = seq * heads * (d // 2)
    if pairs:
        ctx.dispatch("rope.wgsl", "main", [x, table, out],
                     RopeParams(seq, heads, d, int(pos_offset)), (pairs + 255) // 256,
                     {"NEOX": int(style == "neox")})
    return out
