"""What every layer shares: errors, `Tensor`, the backend interface (`Backend`,
`RecordingContext`), the choice of a backend (selection.py) and the choices `pxvm tune`
measured per device (tuning.py). It knows no op, kernel or device API."""

from .backend import (Backend, CapturedWork, DeviceMemory, HostBackend, Readback,
                      RecordingContext, Replay)
from .errors import PxvmError, ShapeError
from .selection import (UnknownBackendError, get_backend, model_backend, reset_backends,
                        unavailable_reason)
from .tensor import DTYPES, Tensor, as_supported_array, dtype_name, values_for

__all__ = [
    "DTYPES", "Backend", "CapturedWork", "DeviceMemory", "HostBackend", "PxvmError", "Readback",
    "RecordingContext", "Replay", "ShapeError", "Tensor", "UnknownBackendError",
    "as_supported_array", "dtype_name", "get_backend", "model_backend", "reset_backends",
    "unavailable_reason", "values_for",
]
