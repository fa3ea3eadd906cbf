"""Multi-head attention (attention.wgsl) with grouped-query heads and a causal mask
offset for KV caches: query i of Sq sees keys j <= i + Skv - Sq. Few queries over many
keys split the keys over several workgroups and merge the partial results. On CUDA a
warp per (query, head) (pxvm.kernels.ptx.attention.attention_f32).
`attention_f16`: the same of float16 q, k, v with float32 results; on CUDA the fused
tensor-core kernel (FlashAttention-2's way: pxvm.kernels.ptx.attention.flash_f16, head
dimensions 64 and 128), on WebGPU attention_f16.wgsl.
(The transformer's attention over a KV cache, with RoPE and the cache's append, is
transformer.attention_cached.)"""

from __future__ import annotations

import math

import numpy as np

from ..kernels.ptx import attention as ptx_attention
from ..runtime.webgpu.params import KernelParams, f32, kernel_params, u32
from .registry import MissingKernelError, meta, op, require

KERNEL = "attention.wgsl"
MAX_HEAD_DIM = 256
# Key splitting (decoding with a long KV cache): below SPLIT_MAX_TASKS (query, head)
# pairs a one-workgroup-per-pair pass cannot fill a large GPU (132 SMs on an H100), so
# runs of at least SPLIT_MIN_KEYS keys are cut into ranges of SPLIT_LEN keys each.
SPLIT_MAX_TASKS = 512
SPLIT_MIN_KEYS = 1024
SPLIT_LEN = 512


@kernel_params(KERNEL, "attention_f16.wgsl")
class AttentionParams(KernelParams):
    sq: u32
    skv: u32
    hq: u32
    hkv: u32
    d: u32
    scale: f32
    n_split: u32    # key ranges per (query, head) (split_keys / combine only)
    split_len: u32  # keys per range


def _infer(q, k, v, causal=True, scale=None):
    require(len(q.shape) == 3 and len(k.shape) == 3 and len(v.shape) == 3,
            f"attention takes q (Sq, Hq, D), k and v (Skv, Hkv, D); got {tuple(q.shape)}, "
            f"{tuple(k.shape)}, {tuple(v.shape)}")
    require(tuple(k.shape) == tuple(v.shape), f"k {tuple(k.shape)} and v {tuple(v.shape)} differ")
    sq, hq, d = q.shape
    skv, hkv, dk = k.shape
    require(d == dk, f"head dimension of q ({d}) and k ({dk}) differ")
    require(hkv >= 1 and hq % hkv == 0,
            f"query heads ({hq}) must be a multiple of key/value heads ({hkv})")
    require(1 <= d <= MAX_HEAD_DIM, f"head dimension must be 1..{MAX_HEAD_DIM}, got {d}")
    require(sq >= 1 and skv >= 1, "attention needs at least one query and one key")
    require(not causal or skv >= sq,
            f"causal attention needs at least as many keys ({skv}) as queries ({sq})")
    return meta(q.shape, np.float32)


def split_plan(sq: int, hq: int, skv: int) -> int:
    """Key ranges per (query, head): 1 (one pass) unless few (query, head) pairs meet
    many keys, where splitting the keys gives the GPU enough workgroups."""
    if sq * hq >= SPLIT_MAX_TASKS or skv < SPLIT_MIN_KEYS:
        return 1
    return -(-skv // SPLIT_LEN)


def _attention_webgpu(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    out = ctx.empty(q.shape, np.float32)
    n_split = split_plan(sq, hq, skv)
    params = AttentionParams(sq, skv, hq, hkv, d, scale, n_split, SPLIT_LEN)
    consts = {"CAUSAL": int(bool(causal))}
    if n_split == 1:
        stand_in = ctx.empty((1,), np.float32, "attention stand-in")
        ctx.dispatch(KERNEL, "main", [q, k, v, out, stand_in], params, sq * hq, consts)
    else:
        part = ctx.empty((sq * hq * n_split, d + 2), np.float32, "attention partial sums")
        ctx.dispatch(KERNEL, "split_keys", [q, k, v, out, part], params,
                     sq * hq * n_split, consts)
        ctx.dispatch(KERNEL, "combine", [q, k, v, out, part], params, sq * hq, consts)
    return out


def _scale(d: int, scale) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


def _key_offset(causal: bool, sq: int, skv: int) -> int:
    """The CUDA kernels' mask: query i sees keys j < min(Skv, i + offset + 1); without
    the causal mask an offset of Skv lets it see every key."""
    return skv - sq if causal else skv


def _attention_cuda(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    out = ctx.empty(q.shape, np.float32)
    ctx.launch(ptx_attention.attention_f32, (-(-d // 32),),
               [q, k, v, out, sq, skv, hq, hkv, d, _key_offset(causal, sq, skv),
                _scale(d, scale) * ptx_attention.LOG2E],
               -(-sq * hq // ptx_attention.WARPS), block=ptx_attention.THREADS)
    return out


@op(infer=_infer, webgpu=_attention_webgpu, cuda=_attention_cuda)
def attention(q, k, v, causal=True, scale=None, *, backend="auto"):
    """softmax(q k^T * scale + mask) v per head; q (Sq, Hq, D), k/v (Skv, Hkv, D); scale
    defaults to 1/sqrt(D)."""
    q = np.asarray(q, np.float64)
    k = np.asarray(k, np.float64)
    v = np.asarray(v, np.float64)
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    group = hq // hkv
    kk = np.repeat(k, group, axis=1)  # (Skv, Hq, D)
    vv = np.repeat(v, group, axis=1)
    scores = np.einsum("ihd,jhd->hij", q, kk) * scale
    if causal:
        allowed = np.arange(skv)[None, :] <= np.arange(sq)[:, None] + (skv - sq)
        scores = np.where(allowed[None], scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)
    p = np.exp(scores)
    p /= p.sum(axis=-1, keepdims=True)
    return np.einsum("hij,jhd->ihd", p, vv).astype(np.float32)


#: (head dimension, keys a tile, warps a block) of the CUDA kernel by head dimension, one
#: of ptx_attention.SHAPES (benchmarks set it)
FLASH_SHAPE = dict(ptx_attention.DEFAULT)


def _attention_f16_cuda(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    shape = FLASH_SHAPE.get(d)
    if shape is None:
        raise MissingKernelError(
            f"attention_f16 on CUDA takes head dimensions {', '.join(map(str, FLASH_SHAPE))} "
            f"so far, not {d}; run it on numpy")
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


def _attention_f16_webgpu(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    out = ctx.empty(q.shape, np.float32)
    params = AttentionParams(sq, skv, hq, hkv, d, _scale(d, scale), 1, skv)
    ctx.dispatch("attention_f16.wgsl", "main", [q, k, v, out], params, sq * hq,
                 {"CAUSAL": int(bool(causal))})
    return out


@op(infer=_infer, dtypes=("f16",), webgpu=_attention_f16_webgpu, cuda=_attention_f16_cuda)
def attention_f16(q, k, v, causal=True, scale=None, *, backend="auto"):
    """attention() of float16 q, k, v (the same shapes and mask), float32 results: on
    CUDA tensor cores with float32 accumulation and P rounded to float16 for P V, as
    FlashAttention does; the reference computes in float64 from the float16 values."""
    return attention.reference(q, k, v, causal, scale)
