"""The numpy backend: the reference. It has no recording context; every op runs its
numpy reference on the tensors' host arrays as it is called (pxvm.ops.registry)."""

from __future__ import annotations

import numpy as np

from .base import Backend
from .tensor import Tensor, as_supported_array, values_for


class NumpyBackend(Backend):
    name = "numpy"

    def describe(self) -> str:
        return f"numpy {np.__version__} on the CPU"

    def from_numpy(self, array) -> Tensor:
        arr = np.array(as_supported_array(array), copy=True)
        return Tensor(arr.shape, arr.dtype, self, arr)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return np.array(tensor.storage, copy=True)

    def write(self, tensor: Tensor, array) -> None:
        tensor.storage[...] = values_for(tensor, array)
