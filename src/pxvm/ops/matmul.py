"""Matrix product (matmul_naive.wgsl, matmul_tiled.wgsl): C = A @ B or A @ B^T for any
M, N, K >= 1. `kernel="auto"` picks the workgroup-per-output matrix-vector kernel for
small M, the register-blocked tiled kernel otherwise."""

from __future__ import annotations

import numpy as np

from .registry import meta, register, require

KERNELS = ("auto", "naive", "tiled", "gemv")
GEMV_MAX_ROWS = 4


def matmul_ref(a, b, transpose_b=False, kernel="auto"):
    """A (M, K) @ B (K, N), or @ B.T for B of shape (N, K) when transpose_b."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a @ (b.T if transpose_b else b)).astype(np.float32)


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
    return "tiled"


def matmul_gpu(ctx, a, b, transpose_b=False, kernel="auto"):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    kernel = choose_kernel(M, N, K) if kernel == "auto" else kernel
    consts = {"TRANSPOSE_B": int(bool(transpose_b))}
    params = (M, N, K)
    if kernel == "tiled":
        ctx.dispatch("matmul_tiled.wgsl", "main", [a, b, out], params,
                     ((N + 63) // 64, (M + 63) // 64, 1), consts)
    elif kernel == "gemv":
        ctx.dispatch("matmul_naive.wgsl", "gemv", [a, b, out], params, M * N, consts)
    else:
        ctx.dispatch("matmul_naive.wgsl", "main", [a, b, out], params,
                     ((N + 15) // 16, (M + 15) // 16, 1), consts)
    return out


matmul = register("matmul", 2, matmul_ref, matmul_gpu, _infer)
