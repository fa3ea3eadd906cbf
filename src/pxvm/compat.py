"""The seeds' entry points, as thin wrappers over pxvm in this one place:

- `pxvm.gpu.executor`: `GPUExecutor` (numpy arrays in and out, a method per op, falling
  back to the fast CPU backend with a logged reason) and `is_gpu_available`;
- `pixel_llm.core.gpu_interface`: `GPUDevice`, `DotProductGPU`, `is_gpu_available`;
- `GpuCommandBatch`: a Batch with a method per op (`batch.relu(x)`), as seed 004's
  batch API has it. pxvm's own way is `with batch:` around plain op calls.
"""

from __future__ import annotations

import logging

import numpy as np

from . import ops
from .backends.webgpu import WebGPUBackend
from .backends.webgpu.runtime import get_device
from .batch import Batch
from .core import PxvmError, as_supported_array, get_backend, unavailable_reason

log = logging.getLogger("pxvm.compat")


def is_gpu_available(device: str | int | None = None) -> bool:
    """True when a WebGPU device can be created (auto never counts software adapters)."""
    if device is None:
        return unavailable_reason("webgpu") is None
    try:
        get_device(device)
        return True
    except PxvmError:
        return False


#: The seeds' API takes any numpy arrays: these wider dtypes are converted (the cast is
#: this API's documented behaviour; values that do not fit are still refused).
SEED_CASTS = {np.dtype(np.float64): "f32", np.dtype(np.int64): "i32"}


def _seed_array(value):
    if isinstance(value, np.ndarray) and value.dtype in SEED_CASTS:
        return as_supported_array(value, SEED_CASTS[value.dtype])
    return value


class GPUExecutor:
    """Runs ops on the GPU, numpy arrays in and out, falling back to the fast CPU backend
    (and saying why) when no GPU is usable: `GPUExecutor().matmul(a, b)`, `await ex.matmul_async(a, b)`
    and so on for every op of pxvm.ops. float64 and int64 arrays are converted to f32 and
    i32 (pxvm's own ops refuse them unless asked)."""

    def __init__(self, device: str | int | None = None, fallback: bool = True):
        self.fallback_reason: str | None = None
        try:
            self.backend = WebGPUBackend(get_device(device))
        except PxvmError as exc:
            if not fallback:
                raise
            self.fallback_reason = str(exc)
            log.warning("GPUExecutor: running on the CPU because %s", exc)
            self.backend = get_backend("cpu")

    @property
    def on_gpu(self) -> bool:
        return self.fallback_reason is None

    @property
    def device_name(self) -> str:
        return self.backend.describe()

    def run(self, name: str, *args, **kwargs) -> np.ndarray:
        """Op `name` of pxvm.ops on numpy arguments; its result as a numpy array."""
        args = [_seed_array(a) for a in args]
        return ops.REGISTRY[name](*args, backend=self.backend, **kwargs).numpy()

    async def run_async(self, name: str, *args, **kwargs) -> np.ndarray:
        args = [_seed_array(a) for a in args]
        return await ops.REGISTRY[name](*args, backend=self.backend, **kwargs).numpy_async()

    def __getattr__(self, name: str):
        base = name.removesuffix("_async")
        if name.startswith("_") or base not in ops.REGISTRY and base != "swish":
            raise AttributeError(name)
        base = "silu" if base == "swish" else base
        if name.endswith("_async"):
            return lambda *args, **kwargs: self.run_async(base, *args, **kwargs)
        return lambda *args, **kwargs: self.run(base, *args, **kwargs)

    def __dir__(self):
        return [*super().__dir__(), *ops.REGISTRY, *(f"{n}_async" for n in ops.REGISTRY)]


class GpuCommandBatch(Batch):
    """Seed 004's batch API: `batch.relu(x)` records op `relu` into this batch."""

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in ops.REGISTRY:
            raise AttributeError(name)

        def record(*args, **kwargs):
            with self:
                return ops.REGISTRY[name](*args, **kwargs)
        return record


class GPUDevice:
    """The device pxvm runs on (or the CPU fallback), with a printable description."""

    def __init__(self, device: str | int | None = None, verbose: bool = True):
        self.executor = GPUExecutor(device)
        if verbose:
            print(f"pxvm device: {self.description}")

    @property
    def description(self) -> str:
        if self.executor.on_gpu:
            return self.executor.device_name
        return f"CPU fallback ({self.executor.fallback_reason})"


class DotProductGPU:
    """Dot product of two vectors with a parallel reduction in workgroup memory."""

    def __init__(self, device: GPUDevice | None = None):
        self.device = device if device is not None else GPUDevice(verbose=False)

    def compute(self, vector_a, vector_b) -> float:
        a = np.asarray(vector_a, dtype=np.float32).reshape(-1)
        b = np.asarray(vector_b, dtype=np.float32).reshape(-1)
        return float(self.device.executor.run("dot", a, b))


__all__ = ["DotProductGPU", "GPUDevice", "GPUExecutor", "GpuCommandBatch", "is_gpu_available"]
