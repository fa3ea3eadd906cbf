"""The lowest layer: devices, memory and programs, one subpackage per GPU API
(`pxvm.runtime.webgpu`), and the errors every layer raises. It knows no ops."""

from .errors import (BindingTooLargeError, DeviceLostError, DeviceSelectionError,
                     GpuUnavailableError, NoAdapterError, OutOfDeviceMemoryError, PxvmError,
                     ShaderCompileError, ShapeError)

__all__ = ["BindingTooLargeError", "DeviceLostError", "DeviceSelectionError",
           "GpuUnavailableError", "NoAdapterError", "OutOfDeviceMemoryError", "PxvmError",
           "ShaderCompileError", "ShapeError"]
