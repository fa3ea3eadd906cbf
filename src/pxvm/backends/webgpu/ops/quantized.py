"""matmul_quant.wgsl for pxvm.ops.quantized, and `product`, the product with its fusions
(a norm before it, a residual or a GLU after it, attention's per-range results merged
into its input) that transformer.py's ops record too.

A product of a few rows runs `matvec` for Q4_K, Q6_K and Q8_0 rows of at least
MATVEC_MIN_K values (a workgroup's threads split a row into 32-value tasks, each shared
by several rows of W), else `matmul` (threads of a column splitting its blocks: `lanes`
of them), or with one lane a column (CPU drivers) and nothing to merge
matmul_quant_columns.wgsl's `matmul_columns` (a thread's four columns sharing x's loads,
no workgroup memory); from TILED_MIN_ROWS rows (a prompt's) `matmul_tiled` (a tile of
rows of x by rows of W, each weight slice dequantized into workgroup memory once per
tile; on CPU drivers a run of SOFTWARE_TILE_RUN tiles a workgroup).
"""

from __future__ import annotations

import numpy as np

from ....core import tuning
from ....ops import quantized
from ....ops.quant_types import quant_type
from ..runtime.params import KernelParams, f32, kernel_params, u32
from .layouts import AttentionPartials
from .subgroups import subgroup_variant

KERNEL = "matmul_quant.wgsl"
#: matmul_quant.wgsl with the row product's lanes summed by subgroup shuffles, for
#: products of more than one lane a column
SUBGROUP_KERNEL = "matmul_quant_subgroups.wgsl"
#: matmul_quant.wgsl for products of one lane a column that merge nothing: its
#: `matmul_columns` reaches no workgroup memory and shares x's loads between columns (the
#: file says why both matter), COLUMNS_PER_GROUP output columns a workgroup
COLUMNS_KERNEL = "matmul_quant_columns.wgsl"
COLUMNS_PER_GROUP = 256
#: The longest attention output (heads x head size) that a product merges from attention's
#: per-range results itself, in workgroup memory: MAX_MERGED (8 KiB: within the 16 KiB
#: every device and browser grants; matmul_quant.wgsl's MERGED_VALUES by default, tests
#: check they agree), LONG_MERGED where the device grants LONG_MERGED_BYTES (Llama 3 8B's
#: 32 heads of 128, merged without a pass of their own).
MAX_MERGED = 2048
LONG_MERGED = 4096
LONG_MERGED_BYTES = 32768


def merged_values(ctx) -> int:
    """The longest attention output a product merges itself on this device."""
    granted = ctx.device.limits.get("max-compute-workgroup-storage-size", 16384)
    return LONG_MERGED if granted >= LONG_MERGED_BYTES else MAX_MERGED


@kernel_params(KERNEL, SUBGROUP_KERNEL, COLUMNS_KERNEL)
class MatmulQuantParams(KernelParams):
    M: u32
    N: u32
    K: u32
    row_bytes: u32   # bytes of one weight row
    eps: f32         # NORM's epsilon
    head_dim: u32    # ATTENTION_PARTS: the merged partials' AttentionPartials
    n_ranges: u32
    range_len: u32
    max_keys: u32
    first_row: u32   # `embed`: the first table row W holds (ids below or past W give 0)


#: Threads per output column (`lanes`) of products of a few rows, as `pxvm tune` measured
#: them on shapes (M, N, K) of LANES_TUNED_SHAPES; forced, every product takes the row
#: kernel with them (the tests of its lanes).
LANES_TUNED = "matmul_quant.webgpu.lanes"
LANES_TUNED_SHAPES = ((16, 1536, 576), (16, 576, 1536))
LANE_CHOICES = (1, 4, 8, 16, 32, 64, 128)
#: Threads per output column on GPUs, by situation: a few rows (until tuned), one row,
#: one row of very many columns (an LM head). Decoding's two are not tuned: `pxvm tune`
#: timed its products one by one and chose 16 and 4 on the H100, which decoded SmolLM2
#: slower than these, even timed as chains of products; a step's fused norms, GLUs and
#: attention merges and its context length decide them (docs/benchmarks-log.md, issue 19).
UNTUNED_LANES = (8, 64, 16)
WIDE_COLUMNS = 16384


def _lanes(ctx, m, n):
    """Threads per output column: 1 on CPU drivers (lavapipe), where the reduction costs
    more than the parallelism gains; on GPUs for several rows as tuned, else 8 (longer
    prompts take the tiled kernel: takes_tiled); for one row (decoding: a chain of small
    dispatches, each as long as its longest thread) 64, or 16 for very many columns (an
    LM head fills the GPU with columns alone): each the fastest for its products in
    SmolLM2's decoding step on the H100 (docs/benchmarks-log.md)."""
    situation = 0 if m > 1 else 2 if n >= WIDE_COLUMNS else 1
    tuned = tuning.choice(ctx.backend, LANES_TUNED) if situation == 0 else None
    if tuned is not None:
        return tuned
    return 1 if ctx.is_software else UNTUNED_LANES[situation]


#: From this many rows of x (a prompt's), products take `matmul_tiled`, which dequantizes
#: each weight block once per tile of rows instead of once per row (faster on lavapipe
#: too: docs/benchmarks-log.md).
TILED_MIN_ROWS = 32
#: The (TILE_M, TILE_N) that `matmul_tiled` takes: rows of x and rows of W a workgroup
#: multiplies, 32, 64 or 128 each but not 32 with 128. A thread takes 4 x 4 outputs (a quad
#: of rows by a quad of columns), two quads along a 128-wide side; the kernel derives its
#: threads from the shape (min(TILE_M / 4, 16) x min(TILE_N / 4, 16): 64 for 32 x 32, 128
#: for 32 x 64, 256 from 64 x 64). GLUs: half the W rows are up rows, so a tile is
#: TILE_N / 2 outputs wide.
TILE_SHAPES = ((32, 32), (32, 64), (64, 32), (64, 64), (64, 128), (128, 64), (128, 128))
#: The shape `matmul_tiled` uses where `pxvm tune` has not chosen one for the device
#: (TILED_TUNED): the fastest on the H100 for SmolLM2's prompts (docs/benchmarks-log.md), though
#: smaller tiles would give a small model's products more workgroups.
TILED_SHAPE = (64, 64)
TILED_TUNED = "matmul_quant.webgpu.tiled_shape"


#: Tiles a `matmul_tiled` workgroup multiplies one after another on CPU drivers (its
#: TILE_RUN; 1 on GPUs, which want every workgroup they can get): a workgroup's start
#: costs there, most under a browser's WebGPU, which zeroes its workgroup memory first
#: (matmul_quant.wgsl). 4 made SmolLM2's prompt products faster on SwiftShader both
#: natively and in the browser page (BENCHMARKS.md, issue 40).
SOFTWARE_TILE_RUN = 4


def tiled_shape(ctx) -> tuple[int, int]:
    """(TILE_M, TILE_N) of `matmul_tiled` on this device: as tuned, else TILED_SHAPE."""
    return tuning.choice(ctx.backend, TILED_TUNED) or TILED_SHAPE


def takes_tiled(m: int, merge=None) -> bool:
    """Whether `product` multiplies x of m rows with `matmul_tiled`: from TILED_MIN_ROWS
    rows, unless the product merges attention's partial results or the row kernel's
    lanes are forced."""
    return merge is None and m >= TILED_MIN_ROWS and tuning.forced(LANES_TUNED) is None


#: The types `matvec` multiplies (its tasks know their blocks' layouts); products of a
#: few rows of the others take `matmul`.
MATVEC_TYPES = ("Q4_K", "Q6_K", "Q8_0")
#: (threads, rows) of `matvec`, as `pxvm tune` chose them for the device; forced, every
#: product of a few rows of MATVEC_TYPES takes `matvec` with them (its tests on lavapipe).
MATVEC_TUNED = "matmul_quant.webgpu.matvec_shape"
MATVEC_SHAPES = tuple((t, r) for t in (32, 64, 128, 256) for r in (1, 2, 4, 8))
#: Rows of W a `matvec` workgroup takes where untuned (half for a GLU's, which reads an
#: up row with each): from a sweep of 1 to 8 on the H200 at Llama 3's shapes, whose
#: timings the GPU's clocks blurred; Q4_K's 8 then decoded 2-5% slower than 4 in fresh
#: processes alternating (docs/benchmarks-log.md); `pxvm tune` measures them.
MATVEC_ROWS = {"Q4_K": 4, "Q6_K": 8, "Q8_0": 8}


#: Rows shorter than this take `matmul` (tuned for SmolLM2's K = 576, whose 18 tasks a
#: row would fill 18 of a 32-thread `matvec` workgroup: its Q8_0 LM head made SmolLM2
#: decode 13% slower on the H200).
MATVEC_MIN_K = 1024


def takes_matvec(ctx, m: int, qtype: str, k: int) -> bool:
    """Whether `product` multiplies x of m rows of k values with `matvec`: a few rows (not
    a prompt's) of a type it knows, from MATVEC_MIN_K values, on a GPU (CPU drivers take
    `matmul` with one lane a column, which needs no barriers); or wherever its shape is
    forced. Not when `matmul`'s lanes are forced."""
    if qtype not in MATVEC_TYPES or m >= TILED_MIN_ROWS or tuning.forced(LANES_TUNED):
        return False
    if tuning.forced(MATVEC_TUNED) is not None:
        return True
    return not ctx.is_software and k >= MATVEC_MIN_K


def matvec_shape(ctx, qtype: str, k: int, glu: bool) -> tuple[int, int]:
    """(threads, rows of W) of a `matvec` workgroup: as tuned, else threads enough for
    one task (32 values) each of a row, 32 to 256, and the type's MATVEC_ROWS (half for
    GLUs)."""
    tuned = tuning.choice(ctx.backend, MATVEC_TUNED)
    if tuned is not None:
        return tuned
    threads = min(256, max(32, 1 << (max(1, k // 32) - 1).bit_length()))
    rows = MATVEC_ROWS[qtype]
    return threads, rows // 2 if glu else rows


def product(ctx, x, w, n, qtype, k, *, gain=None, residual=None, eps=0.0, epilogue=0,
            rows=None, merge: tuple | None = None):
    """Record matmul_quant.wgsl's `matvec` (takes_matvec), `matmul_tiled` (many rows:
    takes_tiled) or `matmul`: y (rows, n), rows = x's (default). `gain` makes it
    norm-fused, `epilogue` 1 adds `residual`, 2 is SwiGLU, 3 GeGLU. `merge` = (state, AttentionPartials) says that x
    holds attention_cached's per-range partial results, which the product merges
    (ATTENTION_PARTS) for the tokens at the state's position."""
    m = x.shape[0] if rows is None else rows
    out = ctx.empty((m, n), np.float32)
    t = quant_type(qtype)
    state, partials = (x, AttentionPartials(0, 0, 0, 0)) if merge is None else merge
    params = MatmulQuantParams(m, n, k, t.row_bytes(k), float(eps), partials.head_dim,
                               partials.n_ranges, partials.range_len, partials.max_keys, 0)
    constants = {"FORMAT": t.code, "BLOCK_VALUES": t.block_values,
                 "BLOCK_BYTES": t.block_bytes, "NORM": int(gain is not None),
                 "EPILOGUE": epilogue}
    # bindings 6 and 7 view x and W again, as vec4s (matvec's loads)
    tensors = [x, w, out, state, x if gain is None else gain, x if residual is None else residual,
               x, w]
    if takes_matvec(ctx, m, qtype, k):
        threads, rows = matvec_shape(ctx, qtype, k, epilogue >= 2)
        constants.update(MV_THREADS=threads, MV_ROWS=rows,
                         ATTENTION_PARTS=int(merge is not None))
        if merge is not None:
            constants.update(partials.constants(), MERGED_VALUES=merged_values(ctx))
        kernel = subgroup_variant(ctx, KERNEL, SUBGROUP_KERNEL)
        ctx.dispatch(kernel, "matvec", tensors, params, (-(-n // rows), m, 1), constants)
        return out
    if takes_tiled(m, merge):
        tile_m, tile_n = tiled_shape(ctx)
        outputs = tile_n // 2 if epilogue >= 2 else tile_n  # columns of y a tile
        run = SOFTWARE_TILE_RUN if ctx.is_software else 1
        ctx.dispatch(KERNEL, "matmul_tiled", tensors, params,
                     (-(-n // (outputs * run)), -(-m // tile_m), 1),
                     {**constants, "TILE_M": tile_m, "TILE_N": tile_n, "TILE_RUN": run})
        return out
    lanes = tuning.forced(LANES_TUNED) or _lanes(ctx, m, n)
    if lanes == 1 and merge is None:
        ctx.dispatch(COLUMNS_KERNEL, "matmul_columns", tensors, params,
                     (-(-n // COLUMNS_PER_GROUP), m, 1), {**constants, "LANES": 1})
        return out
    rows_per_wg = 256 // lanes
    constants.update(LANES=lanes, ATTENTION_PARTS=int(merge is not None))
    if merge is not None:
        # workgroup memory for the K values merged, no more (a browser zeroes all of it)
        constants.update(partials.constants(), MERGED_VALUES=k)
    kernel = subgroup_variant(ctx, KERNEL, SUBGROUP_KERNEL) if lanes > 1 else KERNEL
    ctx.dispatch(kernel, "matmul", tensors, params,
                 ((n + rows_per_wg - 1) // rows_per_wg, m, 1), constants)
    return out


@quantized.matmul_quant.kernel("webgpu")
def matmul_quant(ctx, x, w, *, qtype, k):
    return product(ctx, x, w, w.shape[0], qtype, k)


@quantized.embedding_quant.kernel("webgpu")
def embedding_quant(ctx, ids, w, *, qtype, k, first_row=0):
    s = ids.shape[0]
    out = ctx.empty((s, k), np.float32)
    t = quant_type(qtype)
    ctx.dispatch(KERNEL, "embed", [w, w, out, ids, w, w, w, w],
                 MatmulQuantParams(s, w.shape[0], k, t.row_bytes(k), 0.0, 0, 0, 0, 0,
                                   int(first_row)),
                 ((k + 255) // 256, s, 1),
                 {"FORMAT": t.code, "BLOCK_VALUES": t.block_values,
                  "BLOCK_BYTES": t.block_bytes})
    return out


tuning.tunable(LANES_TUNED, "threads per output column, products of a few rows",
               LANE_CHOICES, ("webgpu",), quantized.product_cases(LANES_TUNED_SHAPES))
# Cases: the products of a 512-token prompt of the default model (SmolLM2: QKV's 960 rows,
# the GLU's 3072, the down projection's K = 1536). With a plain 1536-row product in place
# of the GLU, the H100 chose 64x32, slower than 64x64 for SmolLM2's prompts
# (docs/benchmarks-log.md).
tuning.tunable(TILED_TUNED, "rows of x by rows of W a workgroup of a prompt's product "
               "multiplies (matmul_tiled)", TILE_SHAPES, ("webgpu",),
               quantized.product_cases(((512, 960, 576), (512, 3072, 576), (512, 576, 1536))))
# Cases: decoding's products of an 8B model (Llama 3: dim 4096, FFN 14,336) and a 1B's
# (dim 2048), in the types of its Q4_K_M file.
tuning.tunable(MATVEC_TUNED, "threads and rows of W a workgroup of a decoding product "
               "(matvec) takes", MATVEC_SHAPES, ("webgpu",),
               quantized.product_cases(((1, 4096, 4096), (1, 4096, 14336), (1, 2048, 2048)),
                                       ("Q4_K", "Q6_K")))
