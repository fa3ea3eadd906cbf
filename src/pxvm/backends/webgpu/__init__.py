"""The WebGPU backend: any GPU through wgpu (Vulkan, Metal, DX12) and the browser's
WebGPU. runtime/ is the device layer (adapters, memory, recorders, captured dispatch
lists; no ops), kernels/ the WGSL files (the browser page loads the same text),
backend.py the backend and its recording context, ops/ the ops' kernels."""

from __future__ import annotations

from ...core import selection
from . import ops  # noqa: F401 - registers the kernels
from .backend import CapturedDispatches, WebGPUBackend, WebGPUContext, WgslDevice
from .runtime import get_device, reset_device

_backend: WebGPUBackend | None = None


def webgpu_backend() -> WebGPUBackend:
    """The WebGPU backend on the shared device; raises a PxvmError saying why if none."""
    global _backend
    device = get_device()
    if _backend is None or _backend.device is not device:
        _backend = WebGPUBackend(device)
    return _backend


def _reset() -> None:
    global _backend
    reset_device()
    _backend = None


selection.register("webgpu", webgpu_backend, aliases=("wgpu", "gpu"), reset=_reset)

__all__ = ["CapturedDispatches", "WebGPUBackend", "WebGPUContext", "WgslDevice",
           "webgpu_backend"]
