"""The numpy backend: runs each op's reference implementation on the host."""

from __future__ import annotations

import numpy as np

from ..tensor import Tensor, as_supported_array, values_for


class NumpyBackend:
    name = "cpu"

    def from_numpy(self, array) -> Tensor:
        arr = np.array(as_supported_array(array), copy=True)
        return Tensor(arr.shape, arr.dtype, self, arr)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return np.array(tensor.storage, copy=True)

    def write(self, tensor: Tensor, array) -> None:
        """Overwrite a tensor's values in place from the host."""
        tensor.storage[...] = values_for(tensor, array)

    async def to_numpy_async(self, tensor: Tensor) -> np.ndarray:
        return self.to_numpy(tensor)

    def run(self, op, inputs, params) -> Tensor:
        meta = op.infer(inputs, params)
        out = op.reference(*[t.storage for t in inputs], **params)
        out = np.asarray(out, dtype=meta.dtype).reshape(meta.shape)
        return Tensor(out.shape, out.dtype, self, out)

    def describe(self) -> str:
        return f"numpy {np.__version__} on the CPU"
