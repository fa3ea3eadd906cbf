"""Backends behind one small interface (`base.Backend`): numpy ("cpu") and WebGPU ("gpu").

`get_backend("auto")` gives the WebGPU backend on the best hardware adapter, or the
numpy backend with a logged reason when no GPU is usable.
"""

from __future__ import annotations

import logging

from ..runtime import PxvmError, get_device
from .base import Backend
from .numpy_backend import NumpyBackend
from .webgpu_backend import GpuContext, WebGPUBackend, pack_params

log = logging.getLogger("pxvm.backends")

_numpy = NumpyBackend()
_gpu: WebGPUBackend | None = None
_gpu_failure: str | None = None


def gpu_backend() -> WebGPUBackend:
    """The WebGPU backend on the shared device; raises a PxvmError saying why if none."""
    global _gpu
    dev = get_device()
    if _gpu is None or _gpu.device is not dev:
        _gpu = WebGPUBackend(dev)
    return _gpu


def gpu_unavailable_reason() -> str | None:
    """None when the GPU backend works, else why not (computed once)."""
    global _gpu_failure
    if _gpu is not None:
        return None
    try:
        gpu_backend()
        return None
    except PxvmError as exc:
        _gpu_failure = str(exc)
        return _gpu_failure


def get_backend(name="auto") -> Backend:
    """"auto", "gpu", "cpu" (alias "numpy"), or a backend object."""
    if not isinstance(name, str):
        return name
    key = name.lower()
    if key in ("cpu", "numpy"):
        return _numpy
    if key in ("gpu", "webgpu", "wgpu"):
        return gpu_backend()
    if key == "auto":
        reason = gpu_unavailable_reason()
        if reason is None:
            return gpu_backend()
        if not getattr(get_backend, "_warned", False):
            log.warning("pxvm: no usable GPU, running on numpy: %s", reason)
            get_backend._warned = True
        return _numpy
    raise ValueError(f"unknown backend {name!r}; use 'auto', 'gpu' or 'cpu'")


def reset_backends() -> None:
    global _gpu, _gpu_failure
    _gpu = None
    _gpu_failure = None
    get_backend._warned = False


__all__ = [
    "Backend", "GpuContext", "NumpyBackend", "WebGPUBackend", "get_backend", "gpu_backend",
    "gpu_unavailable_reason", "pack_params", "reset_backends",
]
