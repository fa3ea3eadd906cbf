"""The CPU backend's kernels for the ops: calls of kernels/*.py recorded into a
CpuContext. Ops without one here record their numpy reference, which computes on the
same host arrays (pxvm.ops.registry), so every op runs on this backend."""

from __future__ import annotations

import math

import numpy as np

from ... import ops
from ...ops import decoding, transformer
from ...ops.normalization import rope_table
from .backend import kernel


def register(op):
    return op.kernel("cpu")


@register(ops.matmul_quant)
def matmul_quant(ctx, x, w, *, qtype, k):
    out = ctx.empty((x.shape[0], w.shape[0]), np.float32)
    ctx.call("quantized", "matmul", x, ctx.packed(w, qtype, k), out)
    return out


@register(ops.embedding_quant)
def embedding_quant(ctx, ids, w, *, qtype, k, first_row=0):
    out = ctx.empty((ids.shape[0], k), np.float32)
    ctx.call("quantized", "embed", w, ids, qtype, k, int(first_row), out)
    return out


@register(ops.write_rows)
def write_rows(ctx, dst, src, start=0):
    """The reference, writing into dst itself (the recorded reference would return a
    copy)."""
    arrays = dst.storage, src.storage
    ctx.record_host("write_rows", lambda: ops.write_rows.reference(*arrays, start))
    return dst


@register(transformer.rmsnorm_matmul_quant)
def rmsnorm_matmul_quant(ctx, x, gain, w, *, qtype, k, eps=1e-6):
    out = ctx.empty((x.shape[0], w.shape[0]), np.float32)
    ctx.call("transformer", "norm_matmul", x, gain, float(eps), ctx.packed(w, qtype, k), out)
    return out


@register(transformer.matmul_quant_add)
def matmul_quant_add(ctx, x, w, residual, *, qtype, k):
    out = ctx.empty((x.shape[0], w.shape[0]), np.float32)
    ctx.call("transformer", "matmul_add", x, ctx.packed(w, qtype, k), residual, out)
    return out


@register(transformer.rmsnorm_glu_quant)
def rmsnorm_glu_quant(ctx, x, gain, w, *, qtype, k, eps=1e-6, activation="silu"):
    out = ctx.empty((x.shape[0], w.shape[0] // 2), np.float32)
    ctx.call("transformer", "norm_glu", x, gain, float(eps), ctx.packed(w, qtype, k),
             activation == "gelu_tanh", out)
    return out


@register(transformer.attention_cached)
def attention_cached(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0,
                     style="interleaved", scale=None, max_keys=None, freq_factors=None,
                     attn_factor=1.0, softcap=0.0, window=0):
    n_ctx, _, d = k_cache.shape
    out = ctx.empty((qkv.shape[0], n_heads * d), np.float32)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    bound = max_keys or n_ctx
    ctx.call("transformer", "attention_cached", qkv, k_cache, v_cache, state,
             rope_table(ctx, theta, d, max(n_ctx, bound), freq_factors, attn_factor), n_heads,
             style == "neox", np.float32(scale), np.float32(softcap), int(window), bound, out)
    return out


@register(transformer.attention_paged)
def attention_paged(ctx, qkv, k_pool, v_pool, token_table, block_table, n_heads=1,
                    theta=10000.0, style="interleaved", scale=None, freq_factors=None,
                    attn_factor=1.0, softcap=0.0, window=0):
    _, block_size, _, d = k_pool.shape
    out = ctx.empty((qkv.shape[0], n_heads * d), np.float32)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    positions = block_table.shape[1] * block_size  # the most a sequence's table holds
    ctx.call("transformer", "attention_paged", qkv, k_pool, v_pool, token_table, block_table,
             rope_table(ctx, theta, d, positions, freq_factors, attn_factor), n_heads,
             style == "neox", np.float32(scale), np.float32(softcap), int(window), out)
    return out


@register(transformer.attention_cached_matmul_quant_add)
def attention_cached_matmul_quant_add(ctx, qkv, k_cache, v_cache, state, w, residual, *,
                                      qtype, k, n_heads=1, theta=10000.0, style="interleaved",
                                      scale=None, max_keys=None, freq_factors=None,
                                      attn_factor=1.0, softcap=0.0, window=0):
    attended = attention_cached(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style,
                                scale, max_keys, freq_factors, attn_factor, softcap, window)
    return matmul_quant_add(ctx, attended, w, residual, qtype=qtype, k=k)


@register(decoding.greedy_step)
def greedy_step(ctx, logits, state):
    ctx.call("decoding", "greedy_step", logits, state)
    return state


@register(decoding.advance_tokens)
def advance_tokens(ctx, token_ids, token_table, tokens):
    """The reference, on the tensors themselves (the recorded reference would write into
    copies)."""
    arrays = token_ids.storage, token_table.storage, tokens.storage
    ctx.record_host("advance_tokens", lambda: decoding.advance_tokens.reference(*arrays))
    return token_table


@register(decoding.sample_step)
def sample_step(ctx, logits, state, sampler):
    """Temperature 0 as greedy_step's kernel; sampling as the reference, which draws the
    noise every backend draws."""
    greedy = kernel("decoding", "greedy_step")
    values = logits.storage, state.storage, sampler.storage

    def step():
        if values[2][0] > 0:
            decoding.sample_step.reference(*values)
        else:  # temperature 0: the argmax, without the reference's numpy overhead
            greedy(values[0], values[1])
            values[2][2] += 1
    ctx.record_host("sample_step", step)
    return state
