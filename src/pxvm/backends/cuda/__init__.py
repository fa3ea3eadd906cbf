"""The CUDA backend: NVIDIA GPUs through the driver API (driver.py, NVIDIA's
cuda-bindings), PTX kernels written by Python builders (ptx/, no nvcc at run time),
the backend and its recording context (backend.py: launches queued on a stream, captured
work as CUDA graphs), and the ops' kernels (ops/)."""

from __future__ import annotations

from ...core import selection
from . import ops  # noqa: F401 - registers the kernels
from .backend import CudaBackend, CudaContext
from .driver import (CudaError, CudaUnavailableError, cuda_unavailable_reason, get_cuda_device,
                     list_cuda_devices)

_backend: CudaBackend | None = None


def cuda_backend() -> CudaBackend:
    """The CUDA backend on GPU 0; raises a PxvmError saying why if none."""
    global _backend
    if _backend is None:
        _backend = CudaBackend(get_cuda_device())
    return _backend


selection.register("cuda", cuda_backend, unavailable=cuda_unavailable_reason)

__all__ = ["CudaBackend", "CudaContext", "CudaError", "CudaUnavailableError", "cuda_backend",
           "cuda_unavailable_reason", "get_cuda_device", "list_cuda_devices"]
