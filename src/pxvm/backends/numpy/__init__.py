"""The numpy backend: the reference. It has no recording context and no kernels: every op
runs its numpy reference on the tensors' host arrays as it is called
(pxvm.ops.registry)."""

from __future__ import annotations

import numpy as np

from ...core import HostBackend, selection


class NumpyBackend(HostBackend):
    name = "numpy"

    def describe(self) -> str:
        return f"numpy {np.__version__} on the CPU"


_backend = NumpyBackend()
selection.register("numpy", lambda: _backend)

__all__ = ["NumpyBackend"]
