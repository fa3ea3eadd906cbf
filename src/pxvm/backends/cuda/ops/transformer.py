"""ptx/transformer.py, ptx/rows.py and the products of quantized.py for
pxvm.ops.transformer.

A fused product is one launch of the matrix-vector kernel for decoding's rows (the norm,
the residual's add, the GLU inside it); a prompt's are launches in a row: the norm
(writing float16), the product on tensor cores (with the residual in its pass, or the
GLU as one wgmma launch), or float rows of other lengths unfused. Attention over the
cache is `append` then `attend` (which merges the ranges the keys are cut into and, for
a single token, appends it itself); a prompt's runs on tensor cores where the cache is
plain (flash_f16 reading the position on the device). The caches are float32
(CACHE_DTYPES).
"""

from __future__ import annotations

import math

import numpy as np

from ....ops import MissingKernelError, normalization, quantized, transformer
from ....ops.normalization import rope_table
from ..ptx import attention as ptx_attention
from ..ptx import rows as ptx_rows
from ..ptx import transformer as ptx_transformer
from .attention import flash_shape
from .elementwise import add_kernel, glu
from .normalization import rmsnorm as rmsnorm_kernel
from .quantized import matvec_takes, product, prompt_glu, prompt_product, prompt_takes


def _kernel(unfused, what: str):
    """Op `unfused`'s CUDA kernel (a fused op's unfused launches are made of them)."""
    kernel = unfused.kernels.get("cuda")
    if kernel is None:
        raise MissingKernelError(f"op {what} on CUDA needs op {unfused.name}'s CUDA kernel, "
                                 "which it has not yet; run it on webgpu, cpu or numpy")
    return kernel


def fused_product(ctx, x, w, qtype, k, what: str, gain=None, eps=0.0, residual=None,
                  activation=None):
    """[residual +] h @ W^T (act(h Wg^T) * (h Wu^T) with `activation`), h = rmsnorm(x,
    gain, eps) with a gain, else x: one launch for decoding's rows (matvec_takes); for
    a prompt's (tensor cores) and float rows of other lengths the unfused launches in a
    row."""
    if matvec_takes(x.shape[0], k):
        return product(ctx, x, w, qtype, k, gain=gain, eps=eps, residual=residual,
                       activation=activation)
    if prompt_takes(x.shape[0], k):  # the norm writes float16, the product adds
        h = x if gain is None else rmsnorm_kernel(ctx, x, gain, eps, half=True)
        if activation is not None:  # the GLU in the product's pass where it can
            glu_out = prompt_glu(ctx, h, w, qtype, k, activation)
            if glu_out is not None:
                return glu_out
        out = prompt_product(ctx, h, w, qtype, k, residual=residual)
        if residual is not None:
            return out
    else:
        h = x if gain is None else _kernel(normalization.rmsnorm, what)(ctx, x, gain, eps=eps)
        out = _kernel(quantized.matmul_quant, what)(ctx, h, w, qtype=qtype, k=k)
    if residual is not None:
        return add_kernel(ctx, out, residual)
    if activation is None:
        return out
    return glu(ctx, out, activation)


@transformer.rmsnorm_matmul_quant.kernel("cuda")
def rmsnorm_matmul_quant(ctx, x, gain, w, *, qtype, k, eps=1e-6):
    return fused_product(ctx, x, w, qtype, k, "rmsnorm_matmul_quant", gain=gain, eps=eps)


@transformer.matmul_quant_add.kernel("cuda")
def matmul_quant_add(ctx, x, w, residual, *, qtype, k):
    return fused_product(ctx, x, w, qtype, k, "matmul_quant_add", residual=residual)


@transformer.rmsnorm_glu_quant.kernel("cuda")
def rmsnorm_glu_quant(ctx, x, gain, w, *, qtype, k, eps=1e-6, activation="silu"):
    return fused_product(ctx, x, w, qtype, k, "rmsnorm_glu_quant", gain=gain, eps=eps,
                         activation=activation)


@transformer.qk_norm.kernel("cuda")
def qk_norm(ctx, qkv, q_gain, k_gain, n_heads=1, n_kv_heads=1, eps=1e-6):
    out = ctx.empty(qkv.shape, np.float32)
    d = q_gain.shape[0]
    heads = qkv.size // d
    ctx.launch(ptx_rows.qk_norm, (), [qkv, q_gain, k_gain, out, heads, n_heads, n_kv_heads, d,
                                      eps], -(-heads // ptx_rows.WARPS), block=ptx_rows.THREADS)
    return out


#: Where fewer than SPLIT_MAX_BLOCKS (token, query head) pairs meet more than
#: ONE_RANGE_KEYS keys (decoding), the keys are cut into at most MAX_RANGES ranges of a
#: multiple of RANGE_KEYS keys, a block each, merged by the last of them to finish: one
#: block per pair would leave most of a large GPU idle (132 SMs on an H100) while it
#: walks a long cache. Up to ONE_RANGE_KEYS one block walks them all: cheaper than ranges
#: and their merge there (docs/benchmarks-log.md, "Language models on CUDA"; tests set smaller
#: values, to cut short caches into ranges).
SPLIT_MAX_BLOCKS = 512
ONE_RANGE_KEYS = ptx_transformer.CHUNK
RANGE_KEYS = 32
MAX_RANGES = 64
assert MAX_RANGES <= ptx_transformer.MAX_RANGES


def key_ranges(bound: int, pairs: int) -> tuple[int, int]:
    """(ranges, keys per range) of the attention over `bound` keys for `pairs` (token,
    query head) pairs."""
    if pairs >= SPLIT_MAX_BLOCKS or bound <= ONE_RANGE_KEYS:
        return 1, bound
    range_len = RANGE_KEYS * -(-bound // (RANGE_KEYS * MAX_RANGES))
    return -(-bound // range_len), range_len


def attend(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0, style="interleaved",
           scale=None, max_keys=None, freq_factors=None, attn_factor=1.0, softcap=0.0,
           window=0, half=False):
    """`append` and `attend` (which merges the ranges the keys are cut into, where they
    are, and appends a single token itself); `half`: the output in float16. On sm_90 a
    decoding step's `attend` reads its range's first keys and values before it waits
    for the QKV product (`early`)."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    bound = max_keys or n_ctx
    neox, ring = style == "neox", bound > n_ctx  # a ring: max_keys beyond the cache
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    table = rope_table(ctx, theta, d, max(n_ctx, bound), freq_factors, attn_factor)
    appends = s == 1  # decoding: `attend` appends the token's key and value itself
    elements = s * hkv * d
    if not appends:
        ctx.launch(ptx_transformer.append, (neox, ring),
                   [qkv, k_cache, v_cache, state, table, elements, n_heads, hkv, d, n_ctx,
                    bound], ctx.stride_grid(elements))
    n_ranges, range_len = key_ranges(bound, s * n_heads)
    out = ctx.empty((s, n_heads * d), np.float16 if half else np.float32)
    part = ctx.empty((s * n_heads * n_ranges, d + 2) if n_ranges > 1 else (1,), np.float32,
                     "attention partial sums")
    counts = ctx.counters(s * n_heads if n_ranges > 1 else 1)
    vec = next(v for v in ptx_transformer.VECS if d % v == 0)
    early = appends and ctx.device.info.arch == "sm_90"
    ctx.launch(ptx_transformer.attend, (neox, ring, vec, half, appends, early),
               [qkv, k_cache, v_cache, state, table, part, counts, out, n_heads, hkv, d,
                n_ctx, n_ranges, range_len, bound, scale, float(softcap), int(window)],
               (n_ranges, n_heads, s), block=ptx_transformer.THREADS)
    return out


#: The caches these kernels read: float32 only, so far (a float16 cache is a
#: MissingKernelError here, and a model's kv_cache="auto" takes float32 on CUDA)
CACHE_DTYPES = {"k_cache": "f32", "v_cache": "f32"}

transformer.attention_cached.kernel("cuda", CACHE_DTYPES)(attend)


def _flash_takes(ctx, k_cache, max_keys, softcap, window, scale) -> bool:
    """Whether a prompt's attention runs on tensor cores (_flash_attention): a plain
    cache (no ring, window or soft-cap) of a head size the kernel has."""
    n_ctx, _, d = k_cache.shape
    return (flash_shape(ctx, d) is not None and not softcap and not window
            and (max_keys or n_ctx) <= n_ctx and (scale is None or scale > 0))


def _flash_attention(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style, scale,
                     max_keys, freq_factors, attn_factor):
    """A prompt's attention_cached on tensor cores: ptx_transformer.flash_inputs (the
    caches appended, float16 q, k, v), then ptx_attention.flash_f16 reading the
    position on the device. Float16 inputs and output, as the prompt's products take."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    bound = max_keys or n_ctx
    table = rope_table(ctx, theta, d, n_ctx, freq_factors, attn_factor)
    q16 = ctx.empty((s, n_heads, d), np.float16)
    k16, v16 = (ctx.empty((bound, hkv, d), np.float16) for _ in range(2))
    ctx.launch(ptx_transformer.flash_inputs, (style == "neox",),
               [qkv, k_cache, v_cache, state, table, q16, k16, v16, s, n_heads, hkv, d, bound],
               ctx.stride_grid(s * (n_heads + 2 * hkv) * d + 2 * bound * hkv * d))
    out = ctx.empty((s, n_heads * d), np.float16)  # what the output product reads
    shape = flash_shape(ctx, d)
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    ctx.launch(ptx_attention.flash_f16, (*shape, True, True),
               [q16, k16, v16, out, s, state, n_heads, hkv, scale * ptx_attention.LOG2E],
               (n_heads, -(-s // ptx_attention.flash_rows(shape[2])), 1), block=32 * shape[2])
    return out


@transformer.attention_cached_matmul_quant_add.kernel("cuda", CACHE_DTYPES)
def attention_cached_matmul_quant_add(ctx, qkv, k_cache, v_cache, state, w, residual, *,
                                      qtype, k, n_heads=1, theta=10000.0, style="interleaved",
                                      scale=None, max_keys=None, freq_factors=None,
                                      attn_factor=1.0, softcap=0.0, window=0):
    half = prompt_takes(qkv.shape[0], k)  # attention writes what the product reads
    if half and _flash_takes(ctx, k_cache, max_keys, softcap, window, scale):
        attended = _flash_attention(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style,
                                    scale, max_keys, freq_factors, attn_factor)
        return prompt_product(ctx, attended, w, qtype, k, residual=residual)
    attended = attend(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style, scale,
                      max_keys, freq_factors, attn_factor, softcap, window, half=half)
    if half:
        return prompt_product(ctx, attended, w, qtype, k, residual=residual)
    return matmul_quant_add(ctx, attended, w, residual, qtype=qtype, k=k)

