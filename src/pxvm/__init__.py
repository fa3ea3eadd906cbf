"""pxvm: portable GPU computing for Python through WebGPU, with a numpy backend that
computes the same functions and takes over where no GPU is usable.

    import pxvm
    y = pxvm.ops.matmul(a, b)          # best backend; returns a device-resident Tensor
    y.numpy()                          # read back
"""

from __future__ import annotations

__version__ = "0.1.0"

from . import ops
from .batch import Batch, GpuCommandBatch
from .backends import get_backend
from .runtime.errors import PxvmError, ShapeError
from .tensor import Tensor


def tensor(data, backend="auto") -> Tensor:
    """Put array-like `data` on a backend ("auto", "gpu" or "cpu")."""
    return get_backend(backend).from_numpy(data)


__all__ = ["Batch", "GpuCommandBatch", "PxvmError", "ShapeError", "Tensor", "__version__", "get_backend", "ops", "tensor"]
