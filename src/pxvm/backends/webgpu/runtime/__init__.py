"""The WebGPU runtime: adapters, the device, memory, recorders and captured dispatch
lists, through the `wgpu` package. It knows no ops and no tensors.

`get_device()` returns the process-wide device (created on first use, honouring
`PXVM_DEVICE`); `reset_device()` drops it so the next call picks again (also after a
device loss, which otherwise makes every later call raise DeviceLostError).
"""

from __future__ import annotations

import threading

from .adapters import AdapterDescription, choose_adapter, list_adapters
from .capture import DispatchList
from .device import Device, Pipeline
from .memory import Allocation
from .native import NativeCalls, PortableCalls
from .recorder import (UNIFORM_SLOT, CapturingRecorder, ProfilingRecorder, Recorder,
                       StagingReadback, workgroup_grid)
from .shaders import declared_bindings, kernel_files, load_wgsl

_lock = threading.Lock()
_device: Device | None = None
_device_request = None


def get_device(request: str | int | None = None) -> Device:
    """The shared device. A different `request` than the current one creates a new device."""
    global _device, _device_request
    with _lock:
        if _device is not None and request is not None and request != _device_request:
            _device = None
        if _device is None:  # a lost device stays, so later calls raise DeviceLostError
            _device = Device(request)
            _device_request = request
        return _device


def reset_device() -> None:
    global _device
    with _lock:
        _device = None


__all__ = [
    "UNIFORM_SLOT", "AdapterDescription", "Allocation", "CapturingRecorder", "Device",
    "DispatchList", "NativeCalls", "Pipeline", "PortableCalls", "ProfilingRecorder", "Recorder",
    "StagingReadback", "choose_adapter", "declared_bindings", "get_device", "kernel_files",
    "list_adapters", "load_wgsl", "reset_device", "workgroup_grid",
]
