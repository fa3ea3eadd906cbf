"""ptx/attention.py for pxvm.ops.attention: a warp per (query, head) in float32
(attention_f32); float16 on tensor cores (flash_f16, FlashAttention-2's way: P rounded
to float16 for P V, float32 sums) for head dimensions 64 and 128, in a shape per head
dimension that `pxvm tune` may choose (shape_tuned)."""

from __future__ import annotations

import math

import numpy as np

from ....core import tuning
from ....ops import MissingKernelError
from .... import ops
from ..ptx import attention as ptx_attention


def _scale(d: int, scale) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _key_offset(causal: bool, sq: int, skv: int) -> int:
    """The kernels' mask: query i sees keys j < min(Skv, i + offset + 1); without the
    causal mask an offset of Skv lets it see every key."""
    return skv - sq if causal else skv


@ops.attention.kernel("cuda")
def attention(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    out = ctx.empty(q.shape, np.float32)
    ctx.launch(ptx_attention.attention_f32, (-(-d // 32),),
               [q, k, v, out, sq, skv, hq, hkv, d, _key_offset(causal, sq, skv),
                _scale(d, scale) * ptx_attention.LOG2E],
               -(-sq * hq // ptx_attention.WARPS), block=ptx_attention.THREADS)
    return out


def shape_tuned(d: int) -> str:
    """The tunable naming flash_f16's (head dimension, keys a tile, warps a block) for
    head dimension `d`."""
    return f"attention_f16.cuda.d{d}"


def flash_shape(ctx, d: int) -> tuple[int, int, int] | None:
    """flash_f16's shape for head dimension `d` (None: no kernel for it)."""
    if d not in ptx_attention.DEFAULT:
        return None
    return tuning.choice(ctx.backend, shape_tuned(d)) or ptx_attention.DEFAULT[d]


@ops.attention_f16.kernel("cuda")
def attention_f16(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    shape = flash_shape(ctx, d)
    if shape is None:
        raise MissingKernelError(
            f"attention_f16 on CUDA takes head dimensions "
            f"{', '.join(map(str, ptx_attention.DEFAULT))} so far, not {d}; run it on numpy")
    if _scale(d, scale) <= 0:
        # the kernel keeps each row's max of the unscaled scores
        raise MissingKernelError(
            f"attention_f16 on CUDA takes a positive scale, not {scale}; run it on numpy")
    _, _, warps = shape
    out = ctx.empty(q.shape, np.float32)
    ctx.launch(ptx_attention.flash_f16, shape,
               [q, k, v, out, sq, skv, hq, hkv, _key_offset(causal, sq, skv),
                _scale(d, scale) * ptx_attention.LOG2E],
               (hq, -(-sq // ptx_attention.flash_rows(warps)), 1), block=32 * warps)
    return out


def _cases(d: int):
    def cases(rng, backend) -> list[tuning.TuningCase]:
        heads, kv_heads = 4096 // d, 1024 // d  # Llama-3-8B's width
        q = rng.standard_normal((512, heads, d)).astype(np.float16)
        k = rng.standard_normal((4096, kv_heads, d)).astype(np.float16)
        v = rng.standard_normal((4096, kv_heads, d)).astype(np.float16)
        tq, tk, tv = (backend.from_numpy(x) for x in (q, k, v))
        return [tuning.TuningCase(f"512 queries over 4096 keys, {heads} heads of {d}",
                            lambda: ops.attention_f16(tq, tk, tv),
                            ops.attention_f16.reference(q, k, v), 5e-4)]
    return cases


for _d in ptx_attention.DEFAULT:
    tuning.tunable(shape_tuned(_d), f"attention_f16's (head dimension, keys a tile, warps a "
                   f"block) for heads of {_d}",
                   [s for s in ptx_attention.SHAPES if s[0] == _d], ("cuda",), _cases(_d))
