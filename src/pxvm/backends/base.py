"""The backend interface: the few things every backend (numpy, WebGPU, later CUDA) does."""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    from ..ops.registry import Op
    from ..tensor import Tensor


class Backend(Protocol):
    name: str

    def from_numpy(self, array: np.ndarray) -> "Tensor":
        """Put host data on this backend."""

    def to_numpy(self, tensor: "Tensor") -> np.ndarray:
        """Read a tensor of this backend back to the host."""

    def write(self, tensor: "Tensor", array: np.ndarray) -> None:
        """Overwrite a tensor's values in place from the host."""

    async def to_numpy_async(self, tensor: "Tensor") -> np.ndarray:
        """As to_numpy, awaiting the device without blocking the event loop."""

    def run(self, op: "Op", inputs: list["Tensor"], params: dict) -> "Tensor":
        """Run one op now (the GPU submits it; no readback)."""

    def describe(self) -> str:
        """A one-line description: the backend and the device it runs on."""
