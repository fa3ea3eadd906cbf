"""Seed 000's `pxvm.gpu.executor`: `GPUExecutor` and `is_gpu_available` (pxvm.compat).

    from pxvm.gpu.executor import GPUExecutor, is_gpu_available
    ex = GPUExecutor()              # WebGPU, or the CPU backend with a logged reason
    C = ex.matmul(A, B)             # numpy arrays in and out
    C = await ex.matmul_async(A, B)
"""

from ..compat import GPUExecutor, is_gpu_available

__all__ = ["GPUExecutor", "is_gpu_available"]
