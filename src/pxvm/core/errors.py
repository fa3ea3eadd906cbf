"""The errors pxvm raises on purpose, for every layer; each message says what went wrong
and what to do. The WebGPU ones are named for WebGPU's terms (adapters, bindings)."""

from __future__ import annotations


def shortened(text: str, limit: int = 80) -> str:
    """`text` cut to `limit` characters (with "...") for an error message: inputs quoted in
    messages may be arbitrarily long."""
    return text if len(text) <= limit else text[:limit] + "..."


class PxvmError(Exception):
    """Base of every error pxvm raises on purpose.

    `reason` is the message; `other_backend`, where given, names a backend that runs what
    failed here. str() words that for the Python API (backend='cpu'); the CLI and the web
    page word it their own way from the two (`--backend cpu`)."""

    def __init__(self, *args, other_backend: str | None = None):
        self.reason = str(args[0]) if args else ""
        self.other_backend = other_backend
        if other_backend is not None:
            args = (f"{self.reason}; or run it with backend={other_backend!r}", *args[1:])
        super().__init__(*args)


class NoAdapterError(PxvmError):
    """No WebGPU adapter matches the request (or none exists at all)."""


class DeviceSelectionError(NoAdapterError):
    """`PXVM_DEVICE` or `device=` names no adapter that exists."""


class GpuUnavailableError(PxvmError):
    """wgpu is not installed or the device could not be created."""


class OutOfDeviceMemoryError(PxvmError):
    """The device ran out of memory while allocating a buffer."""


class BindingTooLargeError(PxvmError):
    """A buffer is larger than the device lets one shader binding see."""

    def __init__(self, nbytes: int, limit: int, what: str = "tensor"):
        self.nbytes = nbytes
        self.limit = limit
        super().__init__(
            f"{what} needs a buffer of {nbytes:,} bytes, but this device's "
            f"max_storage_buffer_binding_size is {limit:,} bytes; split the work "
            "into smaller pieces or use a device with a larger binding limit"
        )


class ShaderCompileError(PxvmError):
    """A WGSL kernel failed to compile; the message names the kernel and the line."""


class DeviceLostError(PxvmError):
    """The GPU device was lost; every later call raises this instead of hanging."""


class ShapeError(PxvmError, ValueError):
    """Operands have shapes or dtypes an op cannot take."""
