"""Matrix product (matmul_naive.wgsl, matmul_tiled.wgsl): C = A @ B or A @ B^T for any
M, N, K >= 1. Kernels: "naive" (one output per thread), "gemv" (32 threads per
output, for matrix-vector), "tiled" (64x64 register-blocked tiles) and "tiled_wide"
(64x128 tiles). `kernel="auto"` picks gemv for small M, naive for tiny products, the
wide tiles for large ones and the 64x64 tiles in between. On CUDA (pxvm.kernels.ptx.matmul):
"naive", and "tiled" (128x128 tiles, 8x8 a thread) for the rest."""

from __future__ import annotations

import numpy as np

from ..kernels.ptx import matmul as ptx_matmul
from ..kernels.ptx import tensor_core as ptx_tensor_core
from ..kernels.ptx import wgmma as ptx_wgmma
from ..runtime.webgpu.params import KernelParams, kernel_params, u32
from .registry import MissingKernelError, meta, op, require

KERNELS = ("auto", "naive", "tiled", "tiled_wide", "gemv")
GEMV_MAX_ROWS = 4
GEMV_ROWS_PER_WG = 8  # outputs per gemv workgroup: ROWS_PER_WG in matmul_naive.wgsl
# Above this many outputs the 64x64 tiles lost speed on the H100 (BENCHMARKS.md); 64x128
# tiles move a quarter less data from memory per flop. The threshold is a first guess,
# to be set from `bench_ops.py --kernel tiled|tiled_wide`.
WIDE_MIN_OUTPUTS = 2048 * 2048


@kernel_params("matmul_naive.wgsl", "matmul_tiled.wgsl", "matmul_f16.wgsl")
class MatmulParams(KernelParams):
    M: u32
    N: u32
    K: u32


def _infer(a, b, transpose_b=False, kernel="auto"):
    require(len(a.shape) == 2 and len(b.shape) == 2,
            f"matmul takes 2-D operands, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    require(kernel in KERNELS, f"kernel must be one of {KERNELS}, got {kernel!r}")
    M, K = a.shape
    N, Kb = (b.shape if transpose_b else b.shape[::-1])
    require(K == Kb,
            f"matmul inner dimensions differ: A is {tuple(a.shape)}, B is {tuple(b.shape)}"
            + (" (transpose_b: B is (N, K))" if transpose_b else " (B is (K, N))"))
    require(M > 0 and N > 0 and K > 0, f"matmul needs M, N, K >= 1, got M={M}, N={N}, K={K}")
    return meta((M, N), np.float32)


def choose_kernel(M: int, N: int, K: int) -> str:
    if M <= GEMV_MAX_ROWS:
        return "gemv"
    if M * N < 64 * 64:
        return "naive"
    if M * N > WIDE_MIN_OUTPUTS and N >= 128:
        return "tiled_wide"
    return "tiled"


def _matmul_webgpu(ctx, a, b, transpose_b=False, kernel="auto"):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    kernel = choose_kernel(M, N, K) if kernel == "auto" else kernel
    consts = {"TRANSPOSE_B": int(bool(transpose_b))}
    params = MatmulParams(M, N, K)
    if kernel == "tiled_wide":
        ctx.dispatch("matmul_tiled.wgsl", "main_wide", [a, b, out], params,
                     ((N + 127) // 128, (M + 63) // 64, 1), consts)
    elif kernel == "tiled":
        ctx.dispatch("matmul_tiled.wgsl", "main", [a, b, out], params,
                     ((N + 63) // 64, (M + 63) // 64, 1), consts)
    elif kernel == "gemv":
        ctx.dispatch("matmul_naive.wgsl", "gemv", [a, b, out], params,
                     (M * N + GEMV_ROWS_PER_WG - 1) // GEMV_ROWS_PER_WG, consts)
    else:
        ctx.dispatch("matmul_naive.wgsl", "main", [a, b, out], params,
                     ((N + 15) // 16, (M + 15) // 16, 1), consts)
    return out


#: the tiled CUDA kernel keeps two K slices in shared memory: one barrier a slice instead
#: of two, faster on the H100 (BENCHMARKS.md; benchmarks set it)
FP32_DOUBLE_BUFFER = True


def _matmul_cuda(ctx, a, b, transpose_b=False, kernel="auto"):
    """"naive" or "tiled" (pxvm.kernels.ptx.matmul); the WebGPU-only kernel names (gemv,
    tiled_wide) and "auto" take the tiled kernel except for tiny products."""
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    if kernel == "naive" or (kernel == "auto" and M * N < 64 * 64):
        ctx.launch(ptx_matmul.naive, (bool(transpose_b),), [a, b, out, M, N, K],
                   ctx.stride_grid(M * N))
    else:
        tile = ptx_matmul.TILE
        aligned = K % 4 == 0 and (transpose_b or N % 4 == 0)
        ctx.launch(ptx_matmul.tiled, (bool(transpose_b), aligned, FP32_DOUBLE_BUFFER),
                   [a, b, out, M, N, K],
                   (-(-N // tile), -(-M // tile), 1), block=ptx_matmul.THREADS)
    return out


@op(infer=_infer, webgpu=_matmul_webgpu, cuda=_matmul_cuda)
def matmul(a, b, transpose_b=False, kernel="auto", *, backend="auto"):
    """A (M, K) @ B (K, N), or @ B.T for B of shape (N, K) when transpose_b. `kernel`
    picks the WebGPU kernel (the module's docstring); "auto" chooses by shape."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a @ (b.T if transpose_b else b)).astype(np.float32)


#: (block columns, warp columns, stages) of the mma.sync tensor-core kernel and (block
#: columns, stages, groups in flight) of Hopper's wgmma one (benchmarks set them); "auto"
#: launches wgmma on sm_90, mma.sync elsewhere
TENSOR_CORE_SHAPE = ptx_tensor_core.DEFAULT
WGMMA_SHAPE = ptx_wgmma.DEFAULT
TENSOR_CORE_KERNEL = "auto"


def _infer_f16(a, b, transpose_b=False):
    return _infer(a, b, transpose_b)


def _matmul_f16_cuda(ctx, a, b, transpose_b=False):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    if not transpose_b or K % 8:
        raise MissingKernelError(
            "matmul_f16 on CUDA takes B as (N, K) (transpose_b=True) and K a multiple of 8 "
            f"so far, not {'B as (K, N)' if not transpose_b else f'K = {K}'}; run it on numpy")
    out = ctx.empty((M, N), np.float32)
    kernel = TENSOR_CORE_KERNEL
    if kernel == "auto":
        kernel = "wgmma" if ctx.device.info.arch == "sm_90" else "mma"
    if kernel == "wgmma":
        block_n, stages, _ = shape = WGMMA_SHAPE
        ctx.launch(ptx_wgmma.matmul_f16_wgmma, shape, [a, b, out, M, N, K],
                   (-(-N // block_n), -(-M // ptx_wgmma.ROWS), 1), block=ptx_wgmma.THREADS,
                   shared_bytes=ptx_wgmma.shared_bytes(block_n, stages))
        return out
    block_n, warp_n, stages = shape = TENSOR_CORE_SHAPE
    ctx.launch(ptx_tensor_core.matmul_f16_bt, shape, [a, b, out, M, N, K],
               (-(-N // block_n), -(-M // ptx_tensor_core.TILE), 1),
               block=ptx_tensor_core.threads(block_n, warp_n))
    return out


def _matmul_f16_webgpu(ctx, a, b, transpose_b=False):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    ctx.dispatch("matmul_f16.wgsl", "main", [a, b, out], MatmulParams(M, N, K),
                 -(-M * N // 64), {"TRANSPOSE_B": int(bool(transpose_b))})
    return out


@op(infer=_infer_f16, dtypes=("f16",), webgpu=_matmul_f16_webgpu, cuda=_matmul_f16_cuda)
def matmul_f16(a, b, transpose_b=False, *, backend="auto"):
    """A @ B (A @ B^T with transpose_b) of float16 matrices, float32 results: on CUDA
    tensor cores with float32 accumulation (pxvm.kernels.ptx.tensor_core); on WebGPU
    one output a thread (matmul_f16.wgsl)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a @ (b.T if transpose_b else b)).astype(np.float32)
