"""attention.wgsl and attention_f16.wgsl for pxvm.ops.attention: a workgroup per (query,
head); few queries over many keys (decoding with a long cache) split the keys over
several workgroups and merge the partial results (`combine`)."""

from __future__ import annotations

import math

import numpy as np

from .... import ops
from ..runtime.params import KernelParams, f32, kernel_params, u32

KERNEL = "attention.wgsl"
# Key splitting: below SPLIT_MAX_TASKS (query, head) pairs a one-workgroup-per-pair pass
# cannot fill a large GPU (132 SMs on an H100), so runs of at least SPLIT_MIN_KEYS keys
# are cut into ranges of SPLIT_LEN keys each.
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


def split_plan(sq: int, hq: int, skv: int) -> int:
    """Key ranges per (query, head): 1 (one pass) unless few (query, head) pairs meet
    many keys, where splitting the keys gives the GPU enough workgroups."""
    if sq * hq >= SPLIT_MAX_TASKS or skv < SPLIT_MIN_KEYS:
        return 1
    return -(-skv // SPLIT_LEN)


def _scale(d: int, scale) -> float:
    return 1.0 / math.sqrt(d) if scale is None else float(scale)


@ops.attention.kernel("webgpu")
def attention(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    out = ctx.empty(q.shape, np.float32)
    n_split = split_plan(sq, hq, skv)
    params = AttentionParams(sq, skv, hq, hkv, d, _scale(d, scale), n_split, SPLIT_LEN)
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


@ops.attention_f16.kernel("webgpu")
def attention_f16(ctx, q, k, v, causal=True, scale=None):
    sq, hq, d = q.shape
    skv, hkv, _ = k.shape
    out = ctx.empty(q.shape, np.float32)
    params = AttentionParams(sq, skv, hq, hkv, d, _scale(d, scale), 1, skv)
    ctx.dispatch("attention_f16.wgsl", "main", [q, k, v, out], params, sq * hq,
                 {"CAUSAL": int(bool(causal))})
    return out
