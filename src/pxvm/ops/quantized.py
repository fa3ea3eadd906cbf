"""Ops on GGUF-quantized weights (matmul_quant.wgsl): `matmul_quant` multiplies by a
weight kept in its raw GGUF blocks and dequantized inside the kernel, `embedding_quant`
looks rows up. The numpy references dequantize with the `gguf` package's own code
(quant_types.py). `record_product` is the product's kernel with its fusions, which the
transformer ops (transformer.py) use too; `record_product_cuda` is CUDA's for decoding's
rows (the matrix-vector kernel with the norm, residual or GLU fused in)."""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from ..backends import Tensor
from ..kernels.ptx import dequantize as ptx_dequantize
from ..kernels.ptx import quant_blocks
from ..kernels.ptx import quantized as ptx_quantized
from ..kernels.ptx import wgmma as ptx_wgmma
from ..runtime.webgpu.params import KernelParams, f32, kernel_params, u32
from . import tuning
from .layouts import AttentionPartials
from .matmul import WGMMA_SHAPE, glu_takes, record_f16_glu, record_f16_product
from .quant_types import dequantize, quant_type
from .registry import MissingKernelError, meta, op, require

KERNEL = "matmul_quant.wgsl"
#: matmul_quant.wgsl with the row product's lanes summed by subgroup shuffles, for
#: products of more than one lane a column (tuning.subgroup_variant).
SUBGROUP_KERNEL = "matmul_quant_subgroups.wgsl"
#: Allowed `lanes` (threads per output column; None lets the op choose).
LANE_CHOICES = (None, 1, 2, 4, 8, 16, 32, 64, 128, 256)
#: The longest attention output (heads x head size) that a product merges from attention's
#: per-range results itself: matmul_quant.wgsl's MAX_MERGED (tests check they agree).
MAX_MERGED = 2048


@kernel_params(KERNEL, SUBGROUP_KERNEL)
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


def check_weight(w, qtype, k) -> None:
    """ShapeError unless `w` holds the raw rows of a (N, k) weight of type `qtype`."""
    t = quant_type(qtype)
    require(k > 0 and k % t.block_values == 0,
            f"{t.name} rows need K divisible by {t.block_values}, got K={k}")
    require(len(w.shape) == 2 and w.shape[1] == t.row_bytes(k),
            f"{t.name} weight of K={k} needs (N, {t.row_bytes(k)}) bytes, got {tuple(w.shape)}")


def infer_product(x, w, qtype=3, k=0, lanes=None):
    """Meta of x (M, k) @ W^T for a quantized W (N, k)."""
    check_weight(w, qtype, k)
    require(lanes in LANE_CHOICES, f"lanes must be a power of two <= 256, got {lanes}")
    require(len(x.shape) == 2 and x.shape[1] == k,
            f"matmul_quant: x must be (M, {k}), got {tuple(x.shape)}")
    return meta((x.shape[0], w.shape[0]), np.float32)


#: Products of a few rows (fewer than TILED_MIN_ROWS: more take the tiled kernel, which
#: has no lanes) take the lanes `pxvm tune` chooses per device for these shapes (M, N, K).
LANES_TUNED = "matmul_quant.lanes.prompt"
LANES_TUNED_SHAPES = ((16, 1536, 576), (16, 576, 1536))
#: Threads per output column on GPUs, by situation: a few rows (until tuned), one row,
#: one row of very many columns (an LM head). Decoding's two are not tuned: `pxvm tune`
#: timed its products one by one and chose 16 and 4 on the H100, which decoded SmolLM2
#: slower than these, even timed as chains of products; a step's fused norms, GLUs and
#: attention merges and its context length decide them (BENCHMARKS.md, issue 19).
UNTUNED_LANES = (8, 64, 16)
WIDE_COLUMNS = 16384


def _lanes(ctx, lanes, m, n):
    """Threads per output column: `lanes` if given; 1 on CPU drivers (lavapipe), where
    the reduction costs more than the parallelism gains; on GPUs for several rows as
    tuned, else 8 (longer prompts take the tiled kernel: takes_tiled); for one row
    (decoding: a chain of small dispatches, each as long as its longest thread) 64, or
    16 for very many columns (an LM head fills the GPU with columns alone): each the
    fastest for its products in SmolLM2's decoding step on the H100
    (benchmarks/h100/step_variants.py and tree_ab.py, BENCHMARKS.md)."""
    if lanes:
        return int(lanes)
    situation = 0 if m > 1 else 2 if n >= WIDE_COLUMNS else 1
    tuned = tuning.choice(ctx.backend, LANES_TUNED) if situation == 0 else None
    if tuned is not None:
        return tuned
    return 1 if ctx.is_software else UNTUNED_LANES[situation]


def _random_weight(rng, n: int, k: int, qtype: GGMLQuantizationType) -> np.ndarray:
    """Raw rows of random quants with small finite float16 scales: a benchmark weight,
    for formats gguf cannot quantize. d (and the K types' dmin) lead their blocks, except
    Q6_K's d, which ends them."""
    t = quant_type(int(qtype))
    blocks = rng.integers(0, 256, (n * k // t.block_values, t.block_bytes), dtype=np.uint8)
    scales = {GGMLQuantizationType.Q4_K: 2, GGMLQuantizationType.Q5_K: 2}.get(qtype, 1)
    at = t.block_bytes - 2 if qtype == GGMLQuantizationType.Q6_K else 0
    blocks[:, at:at + 2 * scales] = rng.uniform(0.001, 0.01, (len(blocks), scales)).astype(
        np.float16).view(np.uint8)
    if qtype == GGMLQuantizationType.Q6_K:  # its int8 sub-block scales: small too
        blocks[:, 192:208] = rng.integers(-8, 8, (len(blocks), 16)).astype(np.int8).view(np.uint8)
    return blocks.reshape(n, t.row_bytes(k))


def _product_cases(shapes, types=None):
    """Benchmark cases of matmul_quant for `shapes`: `types`, else a 4-bit weight (Q4_K
    where K allows, else Q4_0) and a Q8_0 one."""
    def cases(rng, backend) -> list[tuning.Case]:
        out = []
        for m, n, k in shapes:
            four = GGMLQuantizationType.Q4_K if k % 256 == 0 else GGMLQuantizationType.Q4_0
            for qtype in types or (four, GGMLQuantizationType.Q8_0):
                w = _random_weight(rng, n, k, qtype)
                x = rng.standard_normal((m, k), np.float32)
                tx, tw = backend.from_numpy(x), backend.from_numpy(w)
                out.append(tuning.Case(
                    f"{qtype.name} {m}x{k} @ {n}x{k}^T",
                    lambda tx=tx, tw=tw, q=int(qtype), k=k: matmul_quant(tx, tw, qtype=q, k=k),
                    matmul_quant.reference(x, w, qtype=int(qtype), k=k), 1e-5))
        return out
    return cases


#: From this many rows of x (a prompt's), WebGPU products take matmul_quant.wgsl's
#: `matmul_tiled`, which dequantizes each weight block once per tile of rows instead of
#: once per row (on lavapipe too: 2-15x faster there for 64 to 512 rows).
TILED_MIN_ROWS = 32
#: The (TILE_M, TILE_N) that `matmul_tiled` takes: rows of x and rows of W a workgroup
#: multiplies, 32, 64 or 128 each but not 32 with 128. A thread takes 4 x 4 outputs (a quad
#: of rows by a quad of columns), two quads along a 128-wide side; the kernel derives its
#: threads from the shape (min(TILE_M / 4, 16) x min(TILE_N / 4, 16): 64 for 32 x 32, 128
#: for 32 x 64, 256 from 64 x 64). GLUs: half the W rows are up rows, so a tile is
#: TILE_N / 2 outputs wide.
TILE_SHAPES = ((32, 32), (32, 64), (64, 32), (64, 64), (64, 128), (128, 64), (128, 128))
#: The shape `matmul_tiled` uses (one of TILE_SHAPES) where `pxvm tune` has not chosen
#: one for the device (TILED_TUNED): the fastest on the H100 for SmolLM2's prompts
#: (benchmarks/h100/prefill_ab.py, BENCHMARKS.md), though smaller tiles would give a small
#: model's products more workgroups.
TILED_SHAPE = (64, 64)
TILED_TUNED = "matmul_quant.tiled.shape"


def tiled_shape(ctx) -> tuple[int, int]:
    """(TILE_M, TILE_N) of `matmul_tiled` on this device: as tuned, else TILED_SHAPE."""
    shape = tuning.choice(ctx.backend, TILED_TUNED) or tuple(TILED_SHAPE)
    if shape not in TILE_SHAPES:
        raise ValueError(f"TILED_SHAPE must be one of {TILE_SHAPES}, not {shape}")
    return shape


def takes_tiled(m: int, lanes=None, merge=None) -> bool:
    """Whether record_product multiplies x of m rows with `matmul_tiled`: from
    TILED_MIN_ROWS rows, unless `lanes` (threads per output column: the row kernel's) is
    given or the product merges attention's partial results."""
    return merge is None and lanes is None and m >= TILED_MIN_ROWS


def record_product(ctx, x, w, n, qtype, k, *, gain=None, residual=None, eps=0.0, lanes=None,
                   epilogue=0, rows=None, merge: tuple | None = None):
    """Record matmul_quant.wgsl's `matmul` (or `matmul_tiled` for many rows: takes_tiled):
    y (rows, n), rows = x's (default). `gain` makes it norm-fused, `epilogue` 1 adds
    `residual`, 2 is SwiGLU, 3 GeGLU. `merge` = (state, AttentionPartials) says that x
    holds attention_cached's per-range partial results, which the product merges
    (ATTENTION_PARTS) for the tokens at the state's position."""
    m = x.shape[0] if rows is None else rows
    out = ctx.empty((m, n), np.float32)
    t = quant_type(qtype)
    state, partials = (x, AttentionPartials(0, 0, 0, 0)) if merge is None else merge
    params = MatmulQuantParams(m, n, k, t.row_bytes(k), float(eps), partials.head_dim,
                               partials.n_ranges, partials.range_len, partials.max_keys, 0)
    constants = {"FORMAT": qtype, "BLOCK_VALUES": t.block_values, "BLOCK_BYTES": t.block_bytes,
                 "NORM": int(gain is not None), "EPILOGUE": epilogue}
    tensors = [x, w, out, state, x if gain is None else gain, x if residual is None else residual]
    if takes_tiled(m, lanes, merge):
        tile_m, tile_n = tiled_shape(ctx)
        outputs = tile_n // 2 if epilogue >= 2 else tile_n  # columns of y a workgroup
        ctx.dispatch(KERNEL, "matmul_tiled", tensors, params,
                     (-(-n // outputs), -(-m // tile_m), 1),
                     {**constants, "TILE_M": tile_m, "TILE_N": tile_n})
        return out
    lanes = _lanes(ctx, lanes, m, n)
    rows_per_wg = 256 // lanes
    constants.update(LANES=lanes, ATTENTION_PARTS=int(merge is not None))
    if merge is not None:
        constants.update(partials.constants())
    kernel = tuning.subgroup_variant(ctx, KERNEL, SUBGROUP_KERNEL) if lanes > 1 else KERNEL
    ctx.dispatch(kernel, "matmul", tensors, params,
                 ((n + rows_per_wg - 1) // rows_per_wg, m, 1), constants)
    return out


def _matmul_quant_webgpu(ctx, x, w, qtype=3, k=0, lanes=None):
    return record_product(ctx, x, w, w.shape[0], qtype, k, lanes=lanes)


def _matmul_quant_cpu(ctx, x, w, qtype=3, k=0, lanes=None):
    out = ctx.empty((x.shape[0], w.shape[0]), np.float32)
    ctx.call("quantized", "matmul", x, ctx.packed(w, qtype, k), out)
    return out


#: From this many rows of x, a product dequantizes W into float16 and multiplies on tensor
#: cores (llama.cpp's way for prompts); below it the matrix-vector kernel reads the
#: quantized weight once per row of x. A first guess (benchmarks/cuda/quantized.py sets it).
PROMPT_MIN_ROWS = 32
#: (outputs a block, rows a group, weight prefetch) of the matrix-vector kernel
#: (pxvm.kernels.ptx.quantized.matvec) by GGML type: the fastest over W 4096 x 4096,
#: 11008 x 4096 and 4096 x 11008 on the H100 (BENCHMARKS.md); `pxvm tune --backend cuda`
#: measures them per device. Types not named take ptx_quantized.DEFAULT_SHAPE and
#: DEFAULT_PREFETCH on sm_90, "none" elsewhere.
MATVEC_SHAPES: dict[int, tuple[int, int]] = {12: (16, 8), 8: (16, 8), 2: (8, 8), 14: (4, 4),
                                              13: (16, 8)}
MATVEC_PREFETCHES: dict[int, str] = {12: "none", 8: "none", 2: "lines", 14: "none", 13: "none"}
#: the prefetch of the types MATVEC_PREFETCHES does not name, on sm_90: "bulk" asks L2
#: for a block's rows before the kernel waits for its predecessor (decoding's graphs)
DEFAULT_PREFETCH = "bulk"
#: the prefetch of every type instead ("auto": MATVEC_PREFETCHES; benchmarks set it)
MATVEC_PREFETCH = "auto"
#: the shape (outputs a block, rows a group) of products whose weight has too few rows
#: to fill the GPU with the type's shape: the fastest for SmolLM2's decoding on the H100
#: (BENCHMARKS.md)
SMALL_SHAPE = (4, 4)
#: their prefetch on sm_90: "bulk" asks L2 for the block's rows before the kernel waits
#: for its predecessor in decoding's graphs (elsewhere "none")
SMALL_PREFETCH = "bulk"
#: Staging a weight's rows in shared memory (ptx_quantized.matvec's "stage", in its
#: STAGED_SHAPE) pays where the whole weight streams in one wave of blocks, each small
#: enough that blocks of the next product fit beside it (a graph's dependent launches
#: then fetch the next weight while this one is multiplied): one to STAGED_WAVE blocks
#: a multiprocessor, of at most STAGED_BLOCK_BYTES. On the H100 Q8_0's 68 KiB blocks
#: gained and Q4_K's 97 KiB ones lost (BENCHMARKS.md). Other weights of RING_TYPES whose
#: rows can be staged stream through a ring (RING_SHAPE's "ring": half its rows in shared
#: memory at once, at most STAGED_BLOCK_BYTES).
STAGED_WAVE = 2
STAGED_BLOCK_BYTES = 72 << 10
#: the types measured faster ringed than read from global memory on the H100 (Q4_K, Q5_K,
#: Q8_0, Q4_0; Q6_K was slower, the others unmeasured: BENCHMARKS.md)
RING_TYPES = (12, 13, 8, 2)
#: rows of x the matrix-vector kernels take (a grid row each: CUDA's grid height)
MAX_GRID_ROWS = 65535


def _planes(ctx, w, qtype, k):
    """W's GGUF rows repacked on the device into one plane a field (quant_blocks.Planes:
    every field 16-byte aligned), made once per weight."""
    fmt = quant_blocks.FORMATS[qtype]

    def make():
        blocks = w.shape[0] * (k // fmt.block_values)
        planes = [ctx.empty((blocks * f.size,), np.uint8) for f in fmt.fields]
        ctx.launch(ptx_quantized.repack, (qtype,), [w, *planes, blocks], ctx.stride_grid(blocks))
        return planes

    return ctx.derived(w, ("planes", qtype, k), make)


def _dequantized_f16(ctx, w, qtype, k):
    """W (N, K) dequantized into a new float16 tensor (F16 rows: W's own memory)."""
    n = w.shape[0]
    if qtype == 1:
        return Tensor((n, k), np.float16, w.backend, w.storage)
    out = ctx.empty((n, k), np.float16)
    scalar = k % quant_blocks.UNIT != 0  # float rows of any length
    builder = ptx_dequantize.dequantize_float_scalar if scalar else ptx_dequantize.dequantize
    ctx.launch(builder, (qtype, "f16", False), [w, out, n, k, n, 0],
               ctx.stride_grid(n * k if scalar else n * k // quant_blocks.UNIT))
    return out


def _f16_weight(ctx, w, qtype, k):
    """W as a float16 (N, K) tensor: F16 rows as they are, the other types dequantized
    into a matrix kept with W while the backend's budget allows (a prompt then skips
    the dequantization: one launch a product fewer)."""
    if qtype == 1:
        return _dequantized_f16(ctx, w, qtype, k)
    return ctx.derived(w, ("float16", qtype, k), lambda: _dequantized_f16(ctx, w, qtype, k),
                       optional=True)


def _f16_glu_weight(ctx, w, qtype, k, block_n: int):
    """A GLU weight [gate; up] as float16 in the row order of the tensor-core GLU kernel
    (ptx_wgmma.glu_rows), kept as _f16_weight is."""
    def make():
        plain = _dequantized_f16(ctx, w, qtype, k)
        out = ctx.empty(plain.shape, np.float16)
        row_bytes = 2 * k
        for i, (first, count) in enumerate(ptx_wgmma.glu_rows(w.shape[0], block_n)):
            ctx.copy(out, plain, count * row_bytes, i * count * row_bytes, first * row_bytes)
        return out

    return ctx.derived(w, ("float16 glu", qtype, k, block_n), make, optional=True)


def record_prompt_glu(ctx, x, w, qtype, k, activation: str):
    """act(x W_gate^T) * (x W_up^T) for W = [W_gate; W_up] as one tensor-core launch
    where the GPU has the GLU kernel (glu_takes), else None (the caller multiplies, then
    applies the GLU)."""
    if not glu_takes(ctx, w.shape[0], activation):
        return None
    if x.dtype != np.float16:
        x = _to_f16(ctx, x)
    return record_f16_glu(ctx, x, _f16_glu_weight(ctx, w, qtype, k, WGMMA_SHAPE[0]),
                          activation)


def _to_f16(ctx, x):
    m, k = x.shape
    x16 = ctx.empty((m, k), np.float16)
    vec = 4 if (m * k) % 4 == 0 else 1
    ctx.launch(ptx_dequantize.to_f16, (vec,), [x, x16, m * k], ctx.stride_grid(m * k // vec))
    return x16


def prompt_takes(m: int, k: int) -> bool:
    """Whether a product of x (m, k) runs as a prompt's: on tensor cores."""
    return m >= PROMPT_MIN_ROWS and k % 8 == 0


def record_prompt_product(ctx, x, w, qtype, k, residual=None):
    """x @ W^T [+ residual] as W dequantized to float16 times x in float16 (converted
    here unless it is already) on tensor cores (prompt_takes)."""
    if x.dtype != np.float16:
        x = _to_f16(ctx, x)
    return record_f16_product(ctx, x, _f16_weight(ctx, w, qtype, k), residual=residual)


def _matvec_shape(ctx, qtype: int, outputs: int, k: int,
                  glu: bool = False) -> tuple[int, int, str]:
    """(rows, group, prefetch) of the matrix-vector kernel for `qtype` and `outputs`
    rows of W (of k values; a GLU's blocks hold half as many outputs): SMALL_SHAPE where
    the type's shape would give fewer blocks than the GPU has multiprocessors (a small
    model's products), STAGED_SHAPE where the weight's rows can be staged in shared
    memory in one wave of blocks (Hopper), RING_SHAPE's ring for the other weights of
    RING_TYPES that can be staged (Hopper), else as tuned for this device, else
    MATVEC_SHAPES / MATVEC_PREFETCHES (DEFAULT_PREFETCH for the types not named). A
    prefetch set for every type (benchmarks and tests sweeping shapes) takes the table
    as it is."""
    hopper = ctx.device.info.arch == "sm_90"
    if MATVEC_PREFETCH == "auto":
        rows = MATVEC_SHAPES.get(qtype, ptx_quantized.DEFAULT_SHAPE)[0]
        blocks = -(-outputs // rows)
        if blocks < ctx.device.info.multiprocessors:
            return (*SMALL_SHAPE, SMALL_PREFETCH if hopper else "none")
        rows, group = ptx_quantized.STAGED_SHAPE
        staged_blocks = -(-outputs // (rows // 2 if glu else rows))
        if (hopper and ptx_quantized.stages(qtype, rows, k)
                and ptx_quantized.staged_bytes(qtype, rows, k) <= STAGED_BLOCK_BYTES
                and ctx.device.info.multiprocessors <= staged_blocks
                <= STAGED_WAVE * ctx.device.info.multiprocessors):
            return rows, group, "stage"
        rows, group = ptx_quantized.RING_SHAPE
        if (hopper and qtype in RING_TYPES and ptx_quantized.stages(qtype, rows, k, "ring")
                and ptx_quantized.staged_bytes(qtype, rows, k, "ring") <= STAGED_BLOCK_BYTES):
            return rows, group, "ring"
    tuned = None
    if qtype in ptx_quantized.SWEPT:
        tuned = tuning.choice(ctx.backend, f"matmul_quant.cuda.{quant_type(qtype).name}")
    if tuned is not None:
        rows, group, prefetch = tuned
    else:
        rows, group = MATVEC_SHAPES.get(qtype, ptx_quantized.DEFAULT_SHAPE)
        prefetch = MATVEC_PREFETCH if MATVEC_PREFETCH != "auto" else MATVEC_PREFETCHES.get(
            qtype, DEFAULT_PREFETCH if hopper else "none")
    # Hopper's own instructions elsewhere: the nearest that every GPU has
    if prefetch == "bulk" and not hopper:
        prefetch = "lines"
    # ... and rows the bulk copies cannot take (or blocks of one group, for a ring) read
    # from global memory
    if prefetch in ptx_quantized.STAGING and not (
            hopper and ptx_quantized.stages(qtype, rows, k, prefetch)
            and ptx_quantized.ring_takes(rows, group, prefetch)):
        prefetch = "none"
    return rows, group, prefetch


def matvec_takes(m: int, k: int) -> bool:
    """Whether the matrix-vector kernel (record_product_cuda) multiplies x (m, k):
    decoding's few rows (prompts take tensor cores from PROMPT_MIN_ROWS rows), rows of
    whole units (float rows of other lengths take matvec_float_scalar)."""
    return 0 < m < PROMPT_MIN_ROWS and k % quant_blocks.UNIT == 0


def record_product_cuda(ctx, x, w, qtype: int, k: int, gain=None, eps: float = 0.0,
                        residual=None, activation: str | None = None):
    """x (M, K) @ W^T in one launch of the matrix-vector kernel (rows of x that
    matvec_takes), with a transformer's ops around it fused in: `gain` normalises x
    first (rmsnorm(x, gain, eps)), `residual` (M, N) is added to the product, and
    `activation` (silu, gelu_tanh) makes it a GLU of W = [W_gate; W_up]: act(x W_gate^T)
    * (x W_up^T), (M, N / 2). The pairs the kernel is made for: ptx_quantized.FUSIONS."""
    m, n = x.shape[0], w.shape[0]
    glu = activation is not None
    outputs = n // 2 if glu else n
    epilogue = activation if glu else "add" if residual is not None else "none"
    if (gain is not None, epilogue) not in ptx_quantized.FUSIONS:
        raise ValueError(f"the matrix-vector kernel fuses {ptx_quantized.FUSIONS} "
                         f"(norm, epilogue), not {(gain is not None, epilogue)}")
    if not matvec_takes(m, k):
        raise ValueError(f"the matrix-vector kernel takes 1..{PROMPT_MIN_ROWS - 1} rows of "
                         f"a multiple of {quant_blocks.UNIT} values, not {m} of {k}")
    out = ctx.empty((m, outputs), np.float32)
    if outputs == 0:
        return out
    fmt = quant_blocks.FORMATS[qtype]
    weights = _planes(ctx, w, qtype, k) if fmt.planes else [w]
    rows, group, prefetch = _matvec_shape(ctx, qtype, outputs, k, glu)
    if glu and rows < 2:  # a gate row and its up row at least
        rows = 2
    shared = ptx_quantized.staged_bytes(qtype, rows, k, prefetch)
    group = ptx_quantized.matvec_group(rows, group, prefetch, epilogue)
    args = [x, *weights, out, outputs, k]
    if gain is not None:
        args += [gain, float(eps)]
    if residual is not None:
        args.append(residual)
    per_block = rows // 2 if glu else rows
    ctx.launch(ptx_quantized.matvec,
               ptx_quantized.matvec_args(qtype, rows, group, prefetch, gain is not None,
                                         epilogue),
               args, (-(-outputs // per_block), m, 1),
               block=ptx_quantized.threads_for(k, prefetch),
               shared_bytes=shared)
    return out


def _matmul_quant_cuda(ctx, x, w, qtype=3, k=0, lanes=None):
    """matmul_quant on CUDA (`lanes` is the WebGPU kernel's): the matrix-vector kernel,
    a grid row per row of x, below PROMPT_MIN_ROWS rows; dequantized W on tensor cores
    from there (K a multiple of 8)."""
    m, n = x.shape[0], w.shape[0]
    if m == 0 or n == 0:
        return ctx.empty((m, n), np.float32)
    if prompt_takes(m, k):
        return record_prompt_product(ctx, x, w, qtype, k)
    if matvec_takes(m, k):
        return record_product_cuda(ctx, x, w, qtype, k)
    fmt = quant_blocks.FORMATS[qtype]
    if m > MAX_GRID_ROWS:
        raise MissingKernelError(f"matmul_quant on CUDA multiplies at most {MAX_GRID_ROWS} rows "
                                 f"of x by {fmt.name} rows of K = {k} at once, not {m}")
    # float rows of any length: not 16-byte aligned
    out = ctx.empty((m, n), np.float32)
    ctx.launch(ptx_quantized.matvec_float_scalar, (qtype,), [x, w, out, n, k],
               (-(-n // ptx_quantized.WARPS), m, 1), block=ptx_quantized.THREADS)
    return out


@op(infer=infer_product, input_dtypes=("f32", "u8"), webgpu=_matmul_quant_webgpu,
    cpu=_matmul_quant_cpu, cuda=_matmul_quant_cuda)
def matmul_quant(x, w, qtype=3, k=0, lanes=None, *, backend="auto"):
    """x (M, K) @ W^T for W (N, K) stored as raw GGUF blocks (N, row_bytes) of type qtype
    (a GGML type number, quant_types.QUANT_TYPES). `lanes`: threads per output column
    of the WebGPU kernel (None: chosen by shape and device)."""
    # float32 BLAS: a float64 copy of every weight per call made decoding far slower, and
    # sgemm's blocked sums are well within the comparisons' tolerance.
    return np.asarray(np.asarray(x, np.float32) @ dequantize(w, qtype, k).T, np.float32)


def _infer_embedding(ids, w, qtype=3, k=0, first_row=0):
    check_weight(w, qtype, k)
    require(len(ids.shape) == 1, f"embedding ids must be 1-D, got {tuple(ids.shape)}")
    require(isinstance(first_row, (int, np.integer)) and 0 <= first_row < 2**31,
            f"embedding first_row must be a row number, got {first_row!r}")
    return meta((ids.shape[0], k), np.float32)


def _embedding_quant_webgpu(ctx, ids, w, qtype=3, k=0, first_row=0):
    s = ids.shape[0]
    out = ctx.empty((s, k), np.float32)
    t = quant_type(qtype)
    ctx.dispatch(KERNEL, "embed", [w, w, out, ids, w, w],
                 MatmulQuantParams(s, w.shape[0], k, t.row_bytes(k), 0.0, 0, 0, 0, 0,
                                   int(first_row)),
                 ((k + 255) // 256, s, 1),
                 {"FORMAT": qtype, "BLOCK_VALUES": t.block_values, "BLOCK_BYTES": t.block_bytes})
    return out


def _embedding_quant_cpu(ctx, ids, w, qtype=3, k=0, first_row=0):
    out = ctx.empty((ids.shape[0], k), np.float32)
    ctx.call("quantized", "embed", w, ids, qtype, k, int(first_row), out)
    return out


def _embedding_quant_cuda(ctx, ids, w, qtype=3, k=0, first_row=0):
    s, n = ids.shape[0], w.shape[0]
    out = ctx.empty((s, k), np.float32)
    if s == 0:
        return out
    scalar = k % quant_blocks.UNIT != 0  # float rows of any length
    builder = ptx_dequantize.dequantize_float_scalar if scalar else ptx_dequantize.dequantize
    ctx.launch(builder, (qtype, "f32", True), [w, ids, out, n, k, s, int(first_row)],
               ctx.stride_grid(s * k if scalar else s * k // quant_blocks.UNIT))
    return out


@op(infer=_infer_embedding, input_dtypes=("i32", "u8"), webgpu=_embedding_quant_webgpu,
    cpu=_embedding_quant_cpu, cuda=_embedding_quant_cuda)
def embedding_quant(ids, w, qtype=3, k=0, first_row=0, *, backend="auto"):
    """Rows ids of W (N, K) stored as raw GGUF blocks: (len(ids), K) float32. W may hold
    part of a table, its rows first_row .. first_row + N - 1 (a table too large for one
    GPU buffer comes in parts): ids outside them give rows of zeros, so that the parts'
    lookups add up to the table's."""
    rows = np.asarray(ids, np.int64) - int(first_row)
    held = (rows >= 0) & (rows < w.shape[0])
    out = dequantize(w, qtype, k)[np.where(held, rows, 0)].astype(np.float32)
    out[~held] = 0.0
    return out


tuning.tunable(LANES_TUNED, "threads per output column, products of a few rows",
               (1, 4, 8, 16, 32, 64, 128), ("webgpu",), _product_cases(LANES_TUNED_SHAPES))
# Cases: the products of a 512-token prompt of the default model (SmolLM2: QKV's 960 rows,
# the GLU's 3072, the down projection's K = 1536). With a plain 1536-row product in place
# of the GLU, the H100 chose 64x32, slower than 64x64 for SmolLM2's prompts (BENCHMARKS.md).
tuning.tunable(TILED_TUNED, "rows of x by rows of W a workgroup of a prompt's product "
               "multiplies (matmul_tiled)", TILE_SHAPES, ("webgpu",),
               _product_cases(((512, 960, 576), (512, 3072, 576), (512, 576, 1536))))
for _code in ptx_quantized.SWEPT:
    _type = GGMLQuantizationType(_code)
    tuning.tunable(
        f"matmul_quant.cuda.{_type.name}",
        f"{_type.name} matrix-vector kernel: outputs a block, rows a group, weight prefetch",
        [(r, g, p) for r, g in ptx_quantized.SHAPES for p in ptx_quantized.PREFETCHES
         if p != "lines" or (r, g) == ptx_quantized.DEFAULT_SHAPE], ("cuda",),
        _product_cases(((1, 4096, 4096), (1, 11008, 4096)), (_type,)))
