"""Matrix products: `matmul`, C = A @ B or A @ B^T of float32 matrices for any M, N, K
>= 1, and `matmul_f16`, the same of float16 matrices with float32 results."""

from __future__ import annotations

import numpy as np

from .registry import meta, op, require


def infer(a, b, transpose_b=False):
    """(M, N) float32 of A (M, K) @ B (K, N), or B (N, K) with transpose_b."""
    require(len(a.shape) == 2 and len(b.shape) == 2,
            f"matmul takes 2-D operands, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    M, K = a.shape
    N, Kb = (b.shape if transpose_b else b.shape[::-1])
    require(K == Kb,
            f"matmul inner dimensions differ: A is {tuple(a.shape)}, B is {tuple(b.shape)}"
            + (" (transpose_b: B is (N, K))" if transpose_b else " (B is (K, N))"))
    require(M > 0 and N > 0 and K > 0, f"matmul needs M, N, K >= 1, got M={M}, N={N}, K={K}")
    return meta((M, N), np.float32)


@op(infer=infer)
def matmul(a, b, transpose_b=False, *, backend="auto"):
    """A (M, K) @ B (K, N), or @ B.T for B of shape (N, K) when transpose_b."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a @ (b.T if transpose_b else b)).astype(np.float32)


@op(infer=infer, dtypes=("f16",))
def matmul_f16(a, b, transpose_b=False, *, backend="auto"):
    """A @ B (A @ B^T with transpose_b) of float16 matrices, float32 results (the
    reference computes in float64 from the float16 values)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a @ (b.T if transpose_b else b)).astype(np.float32)
