"""ptx/quantized.py and ptx/dequantize.py for pxvm.ops.quantized, and `product`, the
product with a transformer's ops fused in that transformer.py records too.

Below PROMPT_MIN_ROWS rows of x (decoding's) a product is one launch of the
matrix-vector kernel (`matvec`: the quantized weight read once per row of x, the norm
before it and the residual's add or a GLU after it in the same launch); from there (a
prompt's) W is dequantized into float16 (kept with W while a budget allows) and
multiplied on tensor cores (matmul.py's f16_product), llama.cpp's way for prompts. On
Hopper, a batch's rows or a short prompt's (BATCH_MIN_ROWS .. QUANT_BATCH_MAX_ROWS) by a
large Q4_K or Q5_K weight take ptx/wgmma_quant.py instead: W's blocks decoded into
shared memory for the tensor cores, read once, with no float16 copy.
"""

from __future__ import annotations

import numpy as np

from ....core import Tensor, tuning
from ....ops import MissingKernelError, quantized
from ..ptx import dequantize as ptx_dequantize
from ..ptx import quant_blocks
from ..ptx import quantized as ptx_quantized
from ..ptx import wgmma as ptx_wgmma
from ..ptx import wgmma_quant as ptx_wgmma_quant
from .matmul import f16_glu, f16_product, glu_takes, k_splits, wgmma_shape

#: From this many rows of x, a product dequantizes W into float16 and multiplies on tensor
#: cores; below it the matrix-vector kernel reads the quantized weight once per row of x.
PROMPT_MIN_ROWS = 32
#: From this many rows (several sequences' decoding steps) a product takes tensor cores
#: too where W's float16 form is kept (or would be: backend.KEEP_FREE), which it reads
#: once for all the rows: 8 rows of an 8B model took 13.2 ms a step through the
#: matrix-vector kernel, one row 4.5, and 7.2 on tensor cores (H200, BENCHMARKS.md,
#: issue 39). The float16 form is 3.5 times a Q4_K weight's bytes, so 2 or 3 rows, not
#: measured, stay with the matrix-vector kernel. Weights of
#: fewer than BATCH_MIN_VALUES values stay with the matrix-vector kernel, which reads them
#: from L2 after the first row (SmolLM2's: 8 sequences decoded at 3,832 tokens/s on
#: tensor cores, 4,521 without, on the H200).
BATCH_MIN_ROWS = 4
BATCH_MIN_VALUES = 1 << 22
#: Up to this many rows, such products of the K-quant types ptx_wgmma_quant decodes read
#: the quantized weight itself on Hopper, decoded into shared memory on the way
#: (quant_batch_takes): no float16 copy is made or read.
QUANT_BATCH_MAX_ROWS = ptx_wgmma_quant.COLUMNS[-1]
#: (outputs a block, rows a group) and weight prefetch of the matrix-vector kernel by GGML
#: type: the fastest over W 4096 x 4096, 11008 x 4096 and 4096 x 11008 on the H100
#: (docs/benchmarks-log.md); `pxvm tune --backend cuda` measures them per device (matvec_tuned).
#: Types not named take ptx_quantized.DEFAULT_SHAPE and DEFAULT_PREFETCH on sm_90, "none"
#: elsewhere.
MATVEC_SHAPES: dict[str, tuple[int, int]] = {"Q4_K": (16, 8), "Q8_0": (16, 8), "Q4_0": (8, 8),
                                              "Q6_K": (4, 4), "Q5_K": (16, 8)}
MATVEC_PREFETCHES: dict[str, str] = {"Q4_K": "none", "Q8_0": "none", "Q4_0": "lines",
                                     "Q6_K": "none", "Q5_K": "none"}
#: the prefetch of the types MATVEC_PREFETCHES does not name, on sm_90: "bulk" asks L2
#: for a block's rows before the kernel waits for its predecessor (decoding's graphs)
DEFAULT_PREFETCH = "bulk"
#: the shape (outputs a block, rows a group) of products whose weight has too few rows
#: to fill the GPU with the type's shape: the fastest for SmolLM2's decoding on the H100
#: (docs/benchmarks-log.md)
SMALL_SHAPE = (4, 4)
#: their prefetch on sm_90: "bulk" asks L2 for the block's rows before the kernel waits
#: for its predecessor in decoding's graphs (elsewhere "none")
SMALL_PREFETCH = "bulk"
#: Staging a weight's rows in shared memory (ptx_quantized.matvec's "stage", in its
#: STAGED_SHAPE) pays where the whole weight streams in one wave of blocks, each small
#: enough that blocks of the next product fit beside it (a graph's dependent launches
#: then fetch the next weight while this one is multiplied): one to STAGED_WAVE blocks
#: a multiprocessor, of at most STAGED_BLOCK_BYTES. On the H100 Q8_0's 68 KiB blocks
#: gained and Q4_K's 97 KiB ones lost (docs/benchmarks-log.md). Other weights of RING_TYPES whose
#: rows can be staged stream through a ring (RING_SHAPE's "ring": half its rows in shared
#: memory at once, at most STAGED_BLOCK_BYTES).
STAGED_WAVE = 2
STAGED_BLOCK_BYTES = 72 << 10
#: the types measured faster ringed than read from global memory on the H100 (Q6_K was
#: slower, the others unmeasured: docs/benchmarks-log.md)
RING_TYPES = ("Q4_K", "Q5_K", "Q8_0", "Q4_0")
#: rows of x the matrix-vector kernels take (a grid row each: CUDA's grid height)
MAX_GRID_ROWS = 65535


def matvec_tuned(qtype: str) -> str:
    """The tunable naming the matrix-vector kernel's (rows, group, prefetch) for `qtype`
    (registered for the types ptx_quantized sweeps; forcing it works for any)."""
    return f"matmul_quant.cuda.{qtype}"


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
    if qtype == "F16":
        return Tensor((n, k), np.float16, w.backend, w.storage)
    out = ctx.empty((n, k), np.float16)
    scalar = k % quant_blocks.UNIT != 0  # float rows of any length
    builder = ptx_dequantize.dequantize_float_scalar if scalar else ptx_dequantize.dequantize
    ctx.launch(builder, (qtype, "f16", False), [w, out, n, k, n, 0],
               ctx.stride_grid(n * k if scalar else n * k // quant_blocks.UNIT))
    return out


def _f16_key(qtype, k):
    return ("float16", qtype, k)


def _f16_glu_key(qtype, k, block_n):
    return ("float16 glu", qtype, k, block_n)


def _f16_weight(ctx, w, qtype, k):
    """W as a float16 (N, K) tensor: F16 rows as they are, the other types dequantized
    into a matrix kept with W while the backend's memory allows (a prompt then skips
    the dequantization: one launch a product fewer)."""
    if qtype == "F16":
        return _dequantized_f16(ctx, w, qtype, k)
    return ctx.derived(w, _f16_key(qtype, k), lambda: _dequantized_f16(ctx, w, qtype, k),
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

    return ctx.derived(w, _f16_glu_key(qtype, k, block_n), make, optional=True)


def to_f16(ctx, x):
    """x (M, K) float32 as a new float16 tensor."""
    m, k = x.shape
    x16 = ctx.empty((m, k), np.float16)
    vec = 4 if (m * k) % 4 == 0 else 1
    ctx.launch(ptx_dequantize.to_f16, (vec,), [x, x16, m * k], ctx.stride_grid(m * k // vec))
    return x16


def f16_kept(ctx, w, qtype, k) -> bool:
    """Whether W's float16 form (either) is kept, or one would be now."""
    backend = ctx.backend
    return (qtype == "F16" or backend.keeps_derived(w, _f16_key(qtype, k))
            or backend.keeps_derived(w, _f16_glu_key(qtype, k, wgmma_shape(ctx)[0]))
            or backend.keeps_optional(w.shape[0] * k * 2))


def quant_batch_takes(ctx, m: int, k: int, w, qtype: str) -> bool:
    """Whether a product of x (m, k) with W runs on tensor cores with W decoded into
    shared memory as it is read (ptx_wgmma_quant): a batch's rows or a short prompt's
    (BATCH_MIN_ROWS .. QUANT_BATCH_MAX_ROWS) by a large weight of a type it decodes, on
    Hopper."""
    return (ctx.device.info.arch == "sm_90" and qtype in ptx_wgmma_quant.TYPES
            and BATCH_MIN_ROWS <= m <= QUANT_BATCH_MAX_ROWS and k % 256 == 0
            and w.shape[0] * k >= BATCH_MIN_VALUES)


def quant_batch_product(ctx, x, w, qtype, k, residual=None, activation: str | None = None):
    """x @ W^T [+ residual] (act(x W_gate^T) * (x W_up^T) with `activation`) by
    ptx_wgmma_quant (quant_batch_takes), x converted to float16 here unless it is; K
    split into ranges where the grid has few blocks (not for a GLU, whose epilogue needs
    whole sums)."""
    if x.dtype != np.float16:
        x = to_f16(ctx, x)
    m, n = x.shape[0], w.shape[0]
    outputs = n // 2 if activation else n
    columns = next(c for c in ptx_wgmma_quant.COLUMNS if c >= m)
    rows = ptx_wgmma_quant.ROWS // 2 if activation else ptx_wgmma_quant.ROWS
    grid = (-(-outputs // rows), -(-m // columns))
    shared = ptx_wgmma_quant.shared_bytes(qtype, columns)
    ahead = ptx_wgmma_quant.AHEAD
    splits = 1 if activation else k_splits(ctx, grid[0] * grid[1], k)
    out = ctx.empty((m, outputs), np.float32)
    if splits == 1:
        epilogue = activation or ("add" if residual is not None else "none")
        ctx.launch(ptx_wgmma_quant.matmul_quant_wgmma, (qtype, columns, ahead, epilogue),
                   [x, w, out, m, n, k, *([residual] if residual is not None else [])],
                   (*grid, 1), block=ptx_wgmma_quant.THREADS, shared_bytes=shared)
        return out
    workspace = ctx.empty((splits, m, n), np.float32)
    ctx.launch(ptx_wgmma_quant.matmul_quant_wgmma, (qtype, columns, ahead, "none", True),
               [x, w, workspace, m, n, k], (*grid, splits), block=ptx_wgmma_quant.THREADS,
               shared_bytes=shared)
    added = residual is not None
    ctx.launch(ptx_wgmma.split_sum, (added,),
               [workspace, out, m * n, splits, *([residual] if added else [])],
               ctx.stride_grid(m * n))
    return out


def prompt_takes(ctx, m: int, k: int, w, qtype: str) -> bool:
    """Whether a product of x (m, k) with W runs as a prompt's, on tensor cores: a
    prompt's rows, or a batch's where W's type is decoded on the way (quant_batch_takes)
    or W is large and its float16 form kept (f16_kept)."""
    if k % 8:
        return False
    if quant_batch_takes(ctx, m, k, w, qtype):
        return True
    if m >= PROMPT_MIN_ROWS:
        return True
    return (m >= BATCH_MIN_ROWS and w.shape[0] * k >= BATCH_MIN_VALUES
            and f16_kept(ctx, w, qtype, k))


def prompt_product(ctx, x, w, qtype, k, residual=None):
    """x @ W^T [+ residual] on tensor cores (prompt_takes): by quant_batch_product where
    it takes, else as W dequantized to float16 times x in float16 (converted here unless
    it is already)."""
    if quant_batch_takes(ctx, x.shape[0], k, w, qtype):
        return quant_batch_product(ctx, x, w, qtype, k, residual=residual)
    if x.dtype != np.float16:
        x = to_f16(ctx, x)
    return f16_product(ctx, x, _f16_weight(ctx, w, qtype, k), residual=residual)


def prompt_glu(ctx, x, w, qtype, k, activation: str):
    """act(x W_gate^T) * (x W_up^T) for W = [W_gate; W_up] as one tensor-core launch
    where the GPU has the GLU kernel (quant_batch_takes, glu_takes), else None (the
    caller multiplies, then applies the GLU)."""
    if (activation in ptx_wgmma_quant.EPILOGUES
            and quant_batch_takes(ctx, x.shape[0], k, w, qtype)):
        return quant_batch_product(ctx, x, w, qtype, k, activation=activation)
    if not glu_takes(ctx, w.shape[0], activation):
        return None
    if x.dtype != np.float16:
        x = to_f16(ctx, x)
    return f16_glu(ctx, x, _f16_glu_weight(ctx, w, qtype, k, wgmma_shape(ctx)[0]), activation)


def matvec_shape(ctx, qtype: str, outputs: int, k: int,
                 glu: bool = False) -> tuple[int, int, str]:
    """(rows, group, prefetch) of the matrix-vector kernel for `qtype` and `outputs`
    rows of W (of k values; a GLU's blocks hold half as many outputs): as forced (the
    tuner and tests), else SMALL_SHAPE where the type's shape would give fewer blocks
    than the GPU has multiprocessors (a small model's products), STAGED_SHAPE where the
    weight's rows can be staged in shared memory in one wave of blocks (Hopper),
    RING_SHAPE's ring for the other weights of RING_TYPES that can be staged (Hopper),
    else as tuned for this device, else MATVEC_SHAPES / MATVEC_PREFETCHES
    (DEFAULT_PREFETCH for the types not named)."""
    hopper = ctx.device.info.arch == "sm_90"
    shape = tuning.forced(matvec_tuned(qtype))
    if shape is None:
        shape = _matvec_rule(ctx, qtype, outputs, k, glu, hopper)
    rows, group, prefetch = shape
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


def _matvec_rule(ctx, qtype, outputs, k, glu, hopper) -> tuple[int, int, str]:
    rows = MATVEC_SHAPES.get(qtype, ptx_quantized.DEFAULT_SHAPE)[0]
    multiprocessors = ctx.device.info.multiprocessors
    if -(-outputs // rows) < multiprocessors:
        return (*SMALL_SHAPE, SMALL_PREFETCH if hopper else "none")
    rows, group = ptx_quantized.STAGED_SHAPE
    staged_blocks = -(-outputs // (rows // 2 if glu else rows))
    if (hopper and ptx_quantized.stages(qtype, rows, k)
            and ptx_quantized.staged_bytes(qtype, rows, k) <= STAGED_BLOCK_BYTES
            and multiprocessors <= staged_blocks <= STAGED_WAVE * multiprocessors):
        return rows, group, "stage"
    rows, group = ptx_quantized.RING_SHAPE
    if (hopper and qtype in RING_TYPES and ptx_quantized.stages(qtype, rows, k, "ring")
            and ptx_quantized.staged_bytes(qtype, rows, k, "ring") <= STAGED_BLOCK_BYTES):
        return rows, group, "ring"
    tuned = None
    if qtype in ptx_quantized.SWEPT:
        tuned = tuning.choice(ctx.backend, matvec_tuned(qtype))
    if tuned is not None:
        return tuned
    rows, group = MATVEC_SHAPES.get(qtype, ptx_quantized.DEFAULT_SHAPE)
    return rows, group, MATVEC_PREFETCHES.get(qtype, DEFAULT_PREFETCH if hopper else "none")


def matvec_takes(m: int, k: int) -> bool:
    """Whether the matrix-vector kernel (`product`) can multiply x (m, k): decoding's few
    rows (prompts take tensor cores from PROMPT_MIN_ROWS rows), rows of whole units
    (float rows of other lengths take matvec_float_scalar). Callers ask prompt_takes
    first: batches take tensor cores where W's float16 form is kept."""
    return 0 < m < PROMPT_MIN_ROWS and k % quant_blocks.UNIT == 0


def product(ctx, x, w, qtype: str, k: int, gain=None, eps: float = 0.0, residual=None,
            activation: str | None = None):
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
    rows, group, prefetch = matvec_shape(ctx, qtype, outputs, k, glu)
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


@quantized.matmul_quant.kernel("cuda")
def matmul_quant(ctx, x, w, *, qtype, k):
    """The matrix-vector kernel, a grid row per row of x, below PROMPT_MIN_ROWS rows;
    dequantized W on tensor cores from there, and from BATCH_MIN_ROWS where it is kept
    (K a multiple of 8: prompt_takes)."""
    m, n = x.shape[0], w.shape[0]
    if m == 0 or n == 0:
        return ctx.empty((m, n), np.float32)
    if prompt_takes(ctx, m, k, w, qtype):
        return prompt_product(ctx, x, w, qtype, k)
    if matvec_takes(m, k):
        return product(ctx, x, w, qtype, k)
    fmt = quant_blocks.FORMATS[qtype]
    if m > MAX_GRID_ROWS:
        raise MissingKernelError(f"matmul_quant on CUDA multiplies at most {MAX_GRID_ROWS} rows "
                                 f"of x by {fmt.name} rows of K = {k} at once, not {m}")
    # float rows of any length: not 16-byte aligned
    out = ctx.empty((m, n), np.float32)
    ctx.launch(ptx_quantized.matvec_float_scalar, (qtype,), [x, w, out, n, k],
               (-(-n // ptx_quantized.WARPS), m, 1), block=ptx_quantized.THREADS)
    return out


@quantized.embedding_quant.kernel("cuda")
def embedding_quant(ctx, ids, w, *, qtype, k, first_row=0):
    s, n = ids.shape[0], w.shape[0]
    out = ctx.empty((s, k), np.float32)
    if s == 0:
        return out
    scalar = k % quant_blocks.UNIT != 0  # float rows of any length
    builder = ptx_dequantize.dequantize_float_scalar if scalar else ptx_dequantize.dequantize
    ctx.launch(builder, (qtype, "f32", True), [w, ids, out, n, k, s, int(first_row)],
               ctx.stride_grid(s * k if scalar else s * k // quant_blocks.UNIT))
    return out


for _type in ptx_quantized.SWEPT:
    tuning.tunable(
        matvec_tuned(_type),
        f"{_type} matrix-vector kernel: outputs a block, rows a group, weight prefetch",
        [(r, g, p) for r, g in ptx_quantized.SHAPES for p in ptx_quantized.PREFETCHES
         if p != "lines" or (r, g) == ptx_quantized.DEFAULT_SHAPE], ("cuda",),
        quantized.product_cases(((1, 4096, 4096), (1, 11008, 4096)), (_type,)))
