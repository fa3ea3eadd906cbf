"""Backends behind one interface (`base.Backend`): "numpy" (the reference, on the CPU),
"cpu" (SIMD kernels compiled by numba, on the quantized weights), "webgpu" (any GPU
through wgpu) and "cuda" (NVIDIA GPUs through the driver, PTX written by pxvm).

`get_backend("auto")` gives WebGPU on the best hardware adapter, or the fast CPU backend
with a logged reason when no GPU is usable. "gpu" names the best GPU backend (WebGPU for
now: CUDA has kernels for part of the ops so far, and is asked for by name).
"""

from __future__ import annotations

import logging

from ..runtime.errors import PxvmError
from ..runtime.cuda import cuda_unavailable_reason, get_cuda_device
from ..runtime.webgpu import get_device, reset_device
from .base import Backend, CapturedWork, Readback, RecordingContext, Replay
from .cpu import CpuBackend, CpuContext
from .cuda import CudaBackend, CudaContext
from .numpy import NumpyBackend
from .tensor import DTYPES, Tensor, as_supported_array, dtype_name, values_for
from .webgpu import CapturedDispatches, WebGPUBackend, WebGPUContext

log = logging.getLogger("pxvm.backends")


class UnknownBackendError(PxvmError, ValueError):
    """A backend was asked for by a name pxvm does not know."""


#: Names a backend may be asked for by, and the backend each means.
ALIASES = {"numpy": "numpy", "cpu": "cpu", "webgpu": "webgpu", "wgpu": "webgpu",
           "gpu": "webgpu", "cuda": "cuda"}
NAMES = ("auto", *ALIASES)

_numpy = NumpyBackend()
_cpu = CpuBackend()
_webgpu: WebGPUBackend | None = None
_webgpu_failure: str | None = None  # why no device could be made (until reset_backends)
_cuda: CudaBackend | None = None
_warned_fallback = False


def webgpu_backend() -> WebGPUBackend:
    """The WebGPU backend on the shared device; raises a PxvmError saying why if none."""
    global _webgpu
    device = get_device()
    if _webgpu is None or _webgpu.device is not device:
        _webgpu = WebGPUBackend(device)
    return _webgpu


def cuda_backend() -> CudaBackend:
    """The CUDA backend on GPU 0; raises a PxvmError saying why if none."""
    global _cuda
    if _cuda is None:
        _cuda = CudaBackend(get_cuda_device())
    return _cuda


def unavailable_reason(name: str) -> str | None:
    """None when backend `name` works here, else why not (asked of the GPU once)."""
    global _webgpu_failure
    if ALIASES.get(name.lower()) == "cuda":
        return cuda_unavailable_reason()
    if ALIASES.get(name.lower()) != "webgpu" or _webgpu is not None:
        return None
    if _webgpu_failure is None:
        try:
            webgpu_backend()
        except PxvmError as exc:
            _webgpu_failure = str(exc)
    return _webgpu_failure


def get_backend(name: str | Backend = "auto") -> Backend:
    """A backend by name ("auto", or one of ALIASES), or `name` itself if a Backend."""
    global _warned_fallback
    if isinstance(name, Backend):
        return name
    key = str(name).lower()
    if key == "auto":
        reason = unavailable_reason("webgpu")
        if reason is None:
            return webgpu_backend()
        if not _warned_fallback:
            log.warning("pxvm: no usable GPU, running on the CPU: %s", reason)
            _warned_fallback = True
        return _cpu
    if key not in ALIASES:
        raise UnknownBackendError(f"unknown backend {name!r}; use one of {', '.join(NAMES)}")
    if ALIASES[key] == "cuda":
        return cuda_backend()
    return {"numpy": _numpy, "cpu": _cpu}.get(ALIASES[key]) or webgpu_backend()


def model_backend(name: str | Backend = "auto") -> tuple[Backend, str | None]:
    """The backend a language model runs on, and why when "auto" chose it: CUDA where an
    NVIDIA GPU and its driver are there (every op a model records has a CUDA kernel, and
    on the H100 it decodes and prefills faster than WebGPU: BENCHMARKS.md), else as
    get_backend("auto") chooses."""
    if isinstance(name, Backend) or str(name).lower() != "auto":
        return get_backend(name), None
    if unavailable_reason("cuda") is None:
        return cuda_backend(), "auto: CUDA runs language models faster than WebGPU on NVIDIA GPUs"
    return get_backend("auto"), None


def reset_backends() -> None:
    """Drop the shared device: the next GPU use picks an adapter again (after a device
    loss, or to honour a new PXVM_DEVICE)."""
    global _webgpu, _webgpu_failure, _warned_fallback
    reset_device()
    _webgpu = _webgpu_failure = None
    _warned_fallback = False


__all__ = [
    "ALIASES", "DTYPES", "NAMES", "Backend", "CapturedDispatches", "CapturedWork",
    "CpuBackend", "CpuContext", "CudaBackend", "CudaContext", "NumpyBackend", "Readback", "RecordingContext", "Replay",
    "Tensor", "UnknownBackendError", "WebGPUBackend", "WebGPUContext", "as_supported_array",
    "cuda_backend", "dtype_name", "get_backend", "model_backend", "reset_backends",
    "unavailable_reason",
    "values_for", "webgpu_backend",
]
