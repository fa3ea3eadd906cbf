"""ptx/transformer.py, ptx/rows.py and the products of quantized.py for
pxvm.ops.transformer.

A fused product is one launch of the matrix-vector kernel for decoding's rows (the norm,
the residual's add, the GLU inside it); a prompt's are launches in a row: the norm
(writing float16), the product on tensor cores (with the residual in its pass, or the
GLU as one wgmma launch), or float rows of other lengths unfused. Attention over the
cache is `append` then `attend` (which merges the ranges the keys are cut into and, for
a single token, appends it itself); a prompt's runs on tensor cores where the cache is
plain (flash_f16 reading the position on the device). The caches are float32 or float16
(CACHE_DTYPES); attention_paged's pools are read by the same kernels through a block
table.
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
from .quantized import (PROMPT_MIN_ROWS, matvec_takes, product, prompt_glu, prompt_product,
                        prompt_takes)


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
    gain, eps) with a gain, else x: for a prompt's rows and a batch's with W's float16
    form kept (prompt_takes: tensor cores) and float rows of other lengths the unfused
    launches in a row; one launch for other decoding rows (matvec_takes)."""
    takes_tensor_cores = prompt_takes(ctx, x.shape[0], k, w, qtype)
    if not takes_tensor_cores and matvec_takes(x.shape[0], k):
        return product(ctx, x, w, qtype, k, gain=gain, eps=eps, residual=residual,
                       activation=activation)
    if takes_tensor_cores:  # the norm writes float16, the product adds
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


#: Where a step's blocks (token, KV head, pack of query heads) are fewer than
#: BUSY_BLOCKS, the keys are cut into ranges of a multiple of RANGE_KEYS keys, a block
#: each, merged by the last of them to finish: one block per pack would leave most of a
#: large GPU idle (132 SMs on an H100) while it walks a long cache. Ranges are cut to
#: give about BUSY_BLOCKS blocks, at most MAX_RANGES; up to ONE_RANGE_KEYS keys one
#: block walks them all (cheaper than ranges and their merge there). Tests set smaller
#: values, to cut short caches into ranges.
BUSY_BLOCKS = 1024
ONE_RANGE_KEYS = ptx_transformer.CHUNK
RANGE_KEYS = 32
MAX_RANGES = 64
assert MAX_RANGES <= ptx_transformer.MAX_RANGES


def key_ranges(bound: int, blocks: int) -> tuple[int, int]:
    """(ranges, keys per range) of the attention over `bound` keys for a step of
    `blocks` blocks (token, KV head, pack)."""
    if blocks >= BUSY_BLOCKS or bound <= ONE_RANGE_KEYS:
        return 1, bound
    wanted = min(MAX_RANGES, -(-BUSY_BLOCKS // blocks))
    range_len = RANGE_KEYS * -(-bound // (RANGE_KEYS * wanted))
    return -(-bound // range_len), range_len


#: Caches of more than PACK_MIN_KEYS keys are read by packs of ptx_transformer.PACK
#: query heads of a KV head (each key read once for them) where the heads of a KV head
#: fill whole packs; shorter ones a head a block, whose walks are shorter and blocks
#: more (H200: SmolLM2's groups of 3 in packs of 4 decoded 11% slower at depth 4,096).
PACK_MIN_KEYS = 1024
#: Steps of at least PACK_MIN_HEADS query heads (tokens x heads: a batch's decoding step)
#: take packs whatever the keys: a head a block would read each key once per head, and
#: the blocks are many anyway.
PACK_MIN_HEADS = 1024


def head_pack(bound: int, group: int, heads: int) -> int:
    """Query heads a block of `attend` takes, for `bound` keys, `group` query heads a KV
    head and `heads` query heads in the step."""
    whole = group % ptx_transformer.PACK == 0
    many = bound > PACK_MIN_KEYS or heads >= PACK_MIN_HEADS
    return ptx_transformer.PACK if whole and many else 1


def _vec(d: int, half_cache: bool) -> int:
    return next(v for v in ptx_transformer.piece_vecs(half_cache) if d % v == 0)


def _attend(ctx, qkv, k_cache, v_cache, positions, rows: list, bound: int, n_heads: int,
            theta, style, scale, freq_factors, attn_factor, softcap, window, addressing,
            half, appends):
    """`append` (unless the attention `appends` the token itself), then `attend`, for
    caches addressed as `addressing` (ptx_transformer.ADDRESSING; `rows`: its ROW_PARAMS
    but max_keys) with `positions` the state or the token table."""
    t = qkv.shape[0]
    hkv, d = k_cache.shape[-2:]
    half_cache = k_cache.dtype == np.float16
    neox = style == "neox"
    scale = 1.0 / math.sqrt(d) if scale is None else float(scale)
    table = rope_table(ctx, theta, d, bound, freq_factors, attn_factor)
    row_args = [rows[0], bound, *rows[1:]]
    if not appends:
        elements = t * hkv * d
        ctx.launch(ptx_transformer.append, (neox, addressing, half_cache),
                   [qkv, k_cache, v_cache, positions, table, elements, n_heads, hkv, d,
                    *row_args], ctx.stride_grid(elements))
    pack = head_pack(bound, n_heads // hkv, t * n_heads)
    packs = -(-(n_heads // hkv) // pack)
    n_ranges, range_len = key_ranges(bound, t * hkv * packs)
    out = ctx.empty((t, n_heads * d), np.float16 if half else np.float32)
    part = ctx.empty((t * n_heads * n_ranges, d + 2) if n_ranges > 1 else (1,), np.float32,
                     "attention partial sums")
    counts = ctx.counters(t * hkv * packs if n_ranges > 1 else 1)
    ctx.launch(ptx_transformer.attend,
               (neox, addressing, half_cache, _vec(d, half_cache), half, appends, pack),
               [qkv, k_cache, v_cache, positions, table, part, counts, out, n_heads, hkv, d,
                n_ranges, range_len, scale, float(softcap), int(window), *row_args],
               (n_ranges, hkv * packs, t), block=ptx_transformer.THREADS)
    return out


def attend(ctx, qkv, k_cache, v_cache, state, n_heads=1, theta=10000.0, style="interleaved",
           scale=None, max_keys=None, freq_factors=None, attn_factor=1.0, softcap=0.0,
           window=0, half=False):
    """attention_cached: `append` and `attend` (which merges the ranges the keys are cut
    into, where they are, and appends a single token itself); `half`: the output in
    float16."""
    n_ctx = k_cache.shape[0]
    bound = max_keys or n_ctx
    addressing = "ring" if bound > n_ctx else "plain"  # a ring: max_keys beyond the cache
    # no block table: the state stands in for its pointer, never read
    return _attend(ctx, qkv, k_cache, v_cache, state, [n_ctx, state, 1, 1, 1], bound, n_heads,
                   theta, style, scale, freq_factors, attn_factor, softcap, window,
                   addressing, half, appends=qkv.shape[0] == 1)


#: The caches these kernels read: float32 and float16 (both alike)
CACHE_DTYPES = {"k_cache": ("f32", "f16"), "v_cache": ("f32", "f16")}

transformer.attention_cached.kernel("cuda", CACHE_DTYPES)(attend)


@transformer.attention_paged.kernel("cuda")
def attention_paged(ctx, qkv, k_pool, v_pool, token_table, block_table, n_heads=1,
                    theta=10000.0, style="interleaved", scale=None, freq_factors=None,
                    attn_factor=1.0, softcap=0.0, window=0):
    n_blocks, block_size, hkv, d = k_pool.shape
    sequences, max_blocks = block_table.shape
    rows = [n_blocks * block_size, block_table, block_size, max_blocks, sequences]
    # a decoding step (a token a sequence): attend appends each token itself
    return _attend(ctx, qkv, k_pool, v_pool, token_table, rows, max_blocks * block_size,
                   n_heads, theta, style, scale, freq_factors, attn_factor, softcap, window,
                   "paged", half=False, appends=qkv.shape[0] == sequences)


def _flash_takes(ctx, k_cache, max_keys, softcap, window, scale) -> bool:
    """Whether a prompt's attention runs on tensor cores (_flash_attention): a plain
    cache (no ring, window or soft-cap) of a head size the kernel has."""
    n_ctx, _, d = k_cache.shape
    return (flash_shape(ctx, d) is not None and not softcap and not window
            and (max_keys or n_ctx) <= n_ctx and (scale is None or scale > 0))


def _flash_attention(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style, scale,
                     max_keys, freq_factors, attn_factor):
    """A prompt's attention_cached on tensor cores: ptx_transformer.flash_inputs (the
    caches appended, float16 q, and k, v: a float16 cache itself, else float16 copies),
    then ptx_attention.flash_f16 reading the position on the device. Float16 inputs and
    output, as the prompt's products take."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    bound = max_keys or n_ctx
    half_cache = k_cache.dtype == np.float16
    table = rope_table(ctx, theta, d, n_ctx, freq_factors, attn_factor)
    q16 = ctx.empty((s, n_heads, d), np.float16)
    if half_cache:
        k16, v16 = k_cache, v_cache
        elements = s * (n_heads + 2 * hkv) * d
    else:
        k16, v16 = (ctx.empty((bound, hkv, d), np.float16) for _ in range(2))
        elements = s * (n_heads + 2 * hkv) * d + 2 * bound * hkv * d
    ctx.launch(ptx_transformer.flash_inputs, (style == "neox", half_cache),
               [qkv, k_cache, v_cache, state, table, q16, k16, v16, s, n_heads, hkv, d, bound],
               ctx.stride_grid(elements))
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
    # a prompt's attention writes what the product reads (a batch's rows take attend)
    half = qkv.shape[0] >= PROMPT_MIN_ROWS and prompt_takes(ctx, qkv.shape[0], k, w, qtype)
    if half and _flash_takes(ctx, k_cache, max_keys, softcap, window, scale):
        attended = _flash_attention(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style,
                                    scale, max_keys, freq_factors, attn_factor)
        return prompt_product(ctx, attended, w, qtype, k, residual=residual)
    attended = attend(ctx, qkv, k_cache, v_cache, state, n_heads, theta, style, scale,
                      max_keys, freq_factors, attn_factor, softcap, window, half=half)
    if half:
        return prompt_product(ctx, attended, w, qtype, k, residual=residual)
    return matmul_quant_add(ctx, attended, w, residual, qtype=qtype, k=k)

