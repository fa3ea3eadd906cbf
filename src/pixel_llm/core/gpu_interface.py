"""Seed 002's GPU interface: `GPUDevice`, `DotProductGPU`, `is_gpu_available`, on pxvm.

    from pixel_llm.core.gpu_interface import DotProductGPU
    DotProductGPU().compute(a, b)     # float; two-pass workgroup reduction on the GPU
"""

from __future__ import annotations

import numpy as np

from pxvm.gpu.executor import GPUExecutor, is_gpu_available


class GPUDevice:
    """The device pxvm runs on (or the numpy fallback), with a printable description."""

    def __init__(self, device: str | int | None = None, verbose: bool = True):
        self.executor = GPUExecutor(device)
        if verbose:
            print(f"pxvm device: {self.description}")

    @property
    def description(self) -> str:
        if self.executor.on_gpu:
            return self.executor.device_name
        return f"numpy fallback ({self.executor.fallback_reason})"


class DotProductGPU:
    """Dot product of two vectors with a parallel reduction in workgroup memory."""

    def __init__(self, device: GPUDevice | None = None):
        self.device = device if device is not None else GPUDevice(verbose=False)

    def compute(self, vector_a, vector_b) -> float:
        a = np.asarray(vector_a, dtype=np.float32).reshape(-1)
        b = np.asarray(vector_b, dtype=np.float32).reshape(-1)
        return float(self.device.executor.dot(a, b))


__all__ = ["DotProductGPU", "GPUDevice", "is_gpu_available"]
