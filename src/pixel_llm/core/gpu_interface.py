"""Seed 002's GPU interface: `GPUDevice`, `DotProductGPU`, `is_gpu_available` (pxvm.compat).

    from pixel_llm.core.gpu_interface import DotProductGPU
    DotProductGPU().compute(a, b)     # float; two-pass workgroup reduction on the GPU
"""

from pxvm.compat import DotProductGPU, GPUDevice, is_gpu_available

__all__ = ["DotProductGPU", "GPUDevice", "is_gpu_available"]
