"""`GPUExecutor`: the seeds' numpy-in, numpy-out API, with a method per op of pxvm.ops.

    from pxvm.gpu.executor import GPUExecutor, is_gpu_available
    ex = GPUExecutor()              # WebGPU, or numpy with a logged reason
    C = ex.matmul(A, B)             # numpy arrays in and out
    C = await ex.matmul_async(A, B)

Each method runs the registered op on the executor's backend and reads the result back.
"""

from __future__ import annotations

import logging

import numpy as np

from ..backends import get_backend
from ..backends.webgpu_backend import WebGPUBackend
from ..ops import REGISTRY
from ..runtime import PxvmError, get_device

log = logging.getLogger("pxvm.gpu")


def is_gpu_available(device: str | int | None = None) -> bool:
    """True when a WebGPU device can be created (auto never counts software adapters)."""
    try:
        get_device(device)
        return True
    except PxvmError:
        return False


class GPUExecutor:
    """Runs ops on the GPU, falling back to numpy (and saying why) when none is usable."""

    def __init__(self, device: str | int | None = None, fallback: bool = True):
        self.fallback_reason: str | None = None
        try:
            self.backend = WebGPUBackend(get_device(device))
        except PxvmError as exc:
            if not fallback:
                raise
            self.fallback_reason = str(exc)
            log.warning("GPUExecutor: running on numpy because %s", exc)
            self.backend = get_backend("cpu")

    @property
    def on_gpu(self) -> bool:
        return self.fallback_reason is None

    @property
    def device_name(self) -> str:
        return self.backend.describe()

    def run(self, name: str, *args, **kwargs) -> np.ndarray:
        return REGISTRY[name](*args, backend=self.backend, **kwargs).numpy()

    async def run_async(self, name: str, *args, **kwargs) -> np.ndarray:
        return await REGISTRY[name](*args, backend=self.backend, **kwargs).numpy_async()


def _method(name: str):
    def sync(self, *args, **kwargs):
        return self.run(name, *args, **kwargs)

    async def run_async(self, *args, **kwargs):
        return await self.run_async(name, *args, **kwargs)

    doc = (REGISTRY[name].__doc__ or "").strip()
    sync.__name__, sync.__doc__ = name, f"{doc}\n\nnumpy arrays in, numpy array out."
    run_async.__name__, run_async.__doc__ = f"{name}_async", f"Awaitable {name}: {doc}"
    return sync, run_async


for _name in REGISTRY:
    _sync, _async = _method(_name)
    setattr(GPUExecutor, _name, _sync)
    setattr(GPUExecutor, f"{_name}_async", _async)
GPUExecutor.swish = GPUExecutor.silu
GPUExecutor.swish_async = GPUExecutor.silu_async
