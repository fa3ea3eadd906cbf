"""pxvm: portable GPU computing for Python. The same ops run on four backends: WebGPU
(any GPU, through wgpu: Vulkan, Metal, DX12), CUDA (NVIDIA GPUs, PTX written by pxvm),
the fast CPU backend (SIMD kernels compiled by numba) and numpy (every op's reference).

    import pxvm
    y = pxvm.ops.matmul(a, b)          # best backend; returns a device-resident Tensor
    y.numpy()                          # read back
    with pxvm.Batch() as batch:        # many ops, one submit
        z = pxvm.ops.relu(pxvm.ops.scale(y, 2.0))
    batch.execute()
    batch.read(z)
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import backends, ops  # noqa: F401 - importing the backends registers them
from .batch import Batch, BatchStateError, Graph
from .compat import GpuCommandBatch
from .core import (Backend, PxvmError, ShapeError, Tensor, as_supported_array, get_backend,
                   unavailable_reason)


def tensor(data, backend: str | Backend = "auto", dtype=None) -> Tensor:
    """`data` (array-like, or a Tensor of any backend) as a tensor on `backend`. numpy
    data keep their dtype; `dtype` ("f32", "i32", ...) converts, checking that the values
    fit (a float64 array is not narrowed to f32 unless asked)."""
    if isinstance(data, Tensor):
        data = data.numpy()
    return get_backend(backend).from_numpy(as_supported_array(data, dtype))


__all__ = ["Backend", "Batch", "BatchStateError", "GpuCommandBatch", "Graph", "PxvmError",
           "ShapeError", "Tensor", "__version__", "get_backend", "ops", "tensor",
           "unavailable_reason"]
