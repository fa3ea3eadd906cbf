"""ptx/matmul.py, ptx/tensor_core.py and ptx/wgmma.py for pxvm.ops.matmul: float32
products as "naive" (tiny ones) or "tiled" (128 x 128 tiles, 8 x 8 a thread), float16
ones on tensor cores: Hopper's wgmma on sm_90, mma.sync elsewhere (KERNEL_TUNED).
`f16_product` and `f16_glu` are also the prompts' quantized products (quantized.py)."""

from __future__ import annotations

import numpy as np

from ....core import tuning
from ....ops import MissingKernelError
from .... import ops
from ..ptx import matmul as ptx_matmul
from ..ptx import tensor_core as ptx_tensor_core
from ..ptx import wgmma as ptx_wgmma
from .elementwise import add_kernel

#: the tensor-core kernel: "wgmma" (Hopper's; sm_90 only) or "mma" (mma.sync, every GPU
#: from sm_80); untuned, wgmma on sm_90
KERNEL_TUNED = "matmul_f16.cuda.kernel"
#: (block columns, warp columns, stages) of the mma.sync kernel; (block columns, stages,
#: groups in flight) of the wgmma one
MMA_SHAPE_TUNED = "matmul_f16.cuda.mma_shape"
WGMMA_SHAPE_TUNED = "matmul_f16.cuda.wgmma_shape"


@ops.matmul.kernel("cuda")
def matmul(ctx, a, b, transpose_b=False):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    if M * N < 64 * 64:
        ctx.launch(ptx_matmul.naive, (bool(transpose_b),), [a, b, out, M, N, K],
                   ctx.stride_grid(M * N))
    else:
        tile = ptx_matmul.TILE
        aligned = K % 4 == 0 and (transpose_b or N % 4 == 0)
        ctx.launch(ptx_matmul.tiled, (bool(transpose_b), aligned), [a, b, out, M, N, K],
                   (-(-N // tile), -(-M // tile), 1), block=ptx_matmul.THREADS)
    return out


@ops.matmul_f16.kernel("cuda")
def matmul_f16(ctx, a, b, transpose_b=False):
    K = a.shape[1]
    if not transpose_b or K % 8:
        raise MissingKernelError(
            "matmul_f16 on CUDA takes B as (N, K) (transpose_b=True) and K a multiple of 8 "
            f"so far, not {'B as (K, N)' if not transpose_b else f'K = {K}'}; run it on numpy")
    return f16_product(ctx, a, b)


def tensor_core_kernel(ctx) -> str:
    """"wgmma" or "mma": as tuned, else wgmma on sm_90 (the only GPUs that have it)."""
    sm_90 = ctx.device.info.arch == "sm_90"
    chosen = tuning.choice(ctx.backend, KERNEL_TUNED)
    if chosen == "mma" or not sm_90:
        return "mma"
    return "wgmma"


def wgmma_shape(ctx) -> tuple[int, int, int]:
    return tuning.choice(ctx.backend, WGMMA_SHAPE_TUNED) or ptx_wgmma.DEFAULT


def glu_takes(ctx, n: int, activation: str) -> bool:
    """Whether a GLU of a weight of `n` rows [gate; up] runs as one tensor-core launch
    (f16_glu): wgmma, and gate rows in whole halves of its block."""
    return (tensor_core_kernel(ctx) == "wgmma" and activation in ptx_wgmma.GLU_ACTIVATIONS
            and (n // 2) % (wgmma_shape(ctx)[0] // 2) == 0 and n % 2 == 0)


def f16_glu(ctx, a, b, activation: str):
    """(M, N / 2) float32 = act(a @ gate^T) * (a @ up^T) of float16 tensors, b (N, K) in
    ptx_wgmma.glu_rows' order for wgmma_shape's block (glu_takes)."""
    M, K = a.shape
    N = b.shape[0]
    out = ctx.empty((M, N // 2), np.float32)
    block_n, stages, _ = shape = wgmma_shape(ctx)
    ctx.launch(ptx_wgmma.matmul_f16_wgmma, (*shape, False, activation), [a, b, out, M, N, K],
               (-(-N // block_n), -(-M // ptx_wgmma.ROWS), 1), block=ptx_wgmma.THREADS,
               shared_bytes=ptx_wgmma.shared_bytes(block_n, stages))
    return out


#: A wgmma product whose grid has fewer blocks than the GPU has multiprocessors (a
#: batch's rows by a weight of 4096 rows: 16 blocks of 256 columns on the H200's 132)
#: splits K into up to MAX_SPLITS ranges of at least MIN_SPLIT_STEPS steps of 64
#: (ptx_wgmma's `split`): a decoding step of 8 sequences of an 8B model took 7.2 ms
#: instead of 15.0, of 64 sequences 14.8 instead of 24.6 (H200, BENCHMARKS.md, issue 39).
MAX_SPLITS = 16
MIN_SPLIT_STEPS = 4


def k_splits(ctx, blocks: int, k: int) -> int:
    """Ranges of K a wgmma product of `blocks` blocks is split into (1: not split)."""
    sms = ctx.device.info.multiprocessors
    if blocks >= sms:
        return 1
    steps = -(-k // ptx_wgmma.DEPTH)
    return max(1, min(MAX_SPLITS, -(-sms // blocks), steps // MIN_SPLIT_STEPS))


def f16_product(ctx, a, b, residual=None):
    """(M, N) float32 = a (M, K) @ b (N, K)^T [+ residual (M, N) float32] of float16
    tensors, K a multiple of 8, on tensor cores. The residual is added in the product's
    own pass by wgmma (by the sum of a split product's ranges: k_splits), by a second
    launch after mma.sync."""
    M, K = a.shape
    N = b.shape[0]
    out = ctx.empty((M, N), np.float32)
    if tensor_core_kernel(ctx) == "wgmma":
        block_n, stages, _ = shape = wgmma_shape(ctx)
        added = residual is not None
        grid = (-(-N // block_n), -(-M // ptx_wgmma.ROWS))
        splits = k_splits(ctx, grid[0] * grid[1], K)
        if splits > 1:
            workspace = ctx.empty((splits, M, N), np.float32)
            ctx.launch(ptx_wgmma.matmul_f16_wgmma, (*shape, False, None, True),
                       [a, b, workspace, M, N, K], (*grid, splits), block=ptx_wgmma.THREADS,
                       shared_bytes=ptx_wgmma.shared_bytes(block_n, stages))
            ctx.launch(ptx_wgmma.split_sum, (added,),
                       [workspace, out, M * N, splits, *([residual] if added else [])],
                       ctx.stride_grid(M * N))
            return out
        ctx.launch(ptx_wgmma.matmul_f16_wgmma, (*shape, added),
                   [a, b, out, M, N, K, *([residual] if added else [])],
                   (-(-N // block_n), -(-M // ptx_wgmma.ROWS), 1), block=ptx_wgmma.THREADS,
                   shared_bytes=ptx_wgmma.shared_bytes(block_n, stages))
        return out
    block_n, warp_n, stages = shape = (tuning.choice(ctx.backend, MMA_SHAPE_TUNED)
                                       or ptx_tensor_core.DEFAULT)
    ctx.launch(ptx_tensor_core.matmul_f16_bt, shape, [a, b, out, M, N, K],
               (-(-N // block_n), -(-M // ptx_tensor_core.TILE), 1),
               block=ptx_tensor_core.threads(block_n, warp_n))
    if residual is None:
        return out
    return add_kernel(ctx, out, residual)


def _cases(rng, backend) -> list[tuning.TuningCase]:
    out = []
    for m, k, n in ((4096, 4096, 4096), (512, 4096, 14336)):
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal((n, k)).astype(np.float16)
        ta, tb = backend.from_numpy(a), backend.from_numpy(b)
        out.append(tuning.TuningCase(
            f"{m} x {k} x {n}",
            lambda ta=ta, tb=tb: ops.matmul_f16(ta, tb, transpose_b=True),
            ops.matmul_f16.reference(a, b, transpose_b=True), 1e-5))
    return out


tuning.tunable(KERNEL_TUNED, "matmul_f16's tensor-core kernel: Hopper's wgmma (sm_90) or "
               "mma.sync", ("wgmma", "mma"), ("cuda",), _cases)
tuning.tunable(MMA_SHAPE_TUNED, "the mma.sync kernel's (block columns, warp columns, stages)",
               ptx_tensor_core.SHAPES, ("cuda",), _cases)
tuning.tunable(WGMMA_SHAPE_TUNED, "the wgmma kernel's (block columns, stages, groups in "
               "flight)", ptx_wgmma.SHAPES, ("cuda",), _cases)
