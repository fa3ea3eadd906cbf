"""pxvm: portable GPU computing for Python, on any GPU through WebGPU, with a numpy
reference backend that computes the same functions where no GPU is usable.

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

from . import ops
from .backends import Backend, Tensor, get_backend
from .batch import Batch, BatchStateError, Graph
from .compat import GpuCommandBatch
from .runtime.errors import PxvmError, ShapeError


def tensor(data, backend: str | Backend = "auto") -> Tensor:
    """`data` (array-like, or a Tensor of any backend) as a tensor on `backend`."""
    return get_backend(backend).from_numpy(data)


__all__ = ["Backend", "Batch", "BatchStateError", "GpuCommandBatch", "Graph", "PxvmError",
           "ShapeError", "Tensor", "__version__", "get_backend", "ops", "tensor"]
