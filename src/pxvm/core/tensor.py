"""`Tensor`: an n-dimensional array that lives on one backend.

Ops take and return tensors without a host round trip; `.numpy()` reads back; numpy
arrays are accepted wherever a tensor is. `pxvm.tensor(t, backend=...)` copies a tensor
to another backend.
"""

from __future__ import annotations

import math

import numpy as np

from .errors import ShapeError

#: dtypes a tensor may have; f16 on the GPU only where the device grants shader-f16.
DTYPES = {
    "f32": np.dtype(np.float32),
    "f16": np.dtype(np.float16),
    "i32": np.dtype(np.int32),
    "u32": np.dtype(np.uint32),
    "u8": np.dtype(np.uint8),
}
_NAME_OF = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype) -> str:
    dt = np.dtype(dtype)
    if dt not in _NAME_OF:
        raise ShapeError(
            f"dtype {dt} is not supported; use one of {', '.join(DTYPES)} "
            "(convert with array.astype(np.float32), for example)"
        )
    return _NAME_OF[dt]


#: Python numbers take these dtypes (by numpy's kind: float, signed, unsigned integer).
NATURAL = {"f": DTYPES["f32"], "i": DTYPES["i32"], "u": DTYPES["u32"], "b": DTYPES["u8"]}


def as_supported_array(value, dtype=None) -> np.ndarray:
    """`value` as a numpy array of a pxvm dtype (DTYPES). Python numbers and lists take
    the natural one (floats f32, integers i32, bools u8). numpy data keep theirs; a wider
    one (float64, int64) is refused rather than narrowed silently: convert it first
    (`array.astype(np.float32)`) or ask with `dtype=` ("f32", "i32", ... or a numpy
    dtype), which converts, refusing integers that do not fit and floats that would
    overflow. ShapeError says which and what to do."""
    if dtype is not None:
        return _converted(np.asarray(value), np.dtype(DTYPES.get(dtype, dtype)))
    arr = np.asarray(value)
    if arr.dtype in _NAME_OF:
        return arr
    natural = NATURAL.get(arr.dtype.kind)
    if natural is None or (isinstance(value, (np.ndarray, np.generic)) and arr.dtype != np.bool_):
        raise ShapeError(
            f"{arr.dtype} data are not a pxvm dtype ({', '.join(DTYPES)}) and are not narrowed "
            f"silently: convert them first (array.astype(np.{(natural or DTYPES['f32']).name})) or "
            f"pass dtype= to pxvm.tensor, which checks that the values fit")
    return _converted(arr, natural)


def _converted(arr: np.ndarray, target: np.dtype) -> np.ndarray:
    """`arr` as `target`, refusing values that would not survive the conversion."""
    name = dtype_name(target)
    if arr.dtype == target:
        return arr
    if target.kind in "iu" and arr.size:
        if arr.dtype.kind == "f" and not np.array_equal(arr, np.trunc(arr)):
            raise ShapeError(f"cannot convert non-integral values to {name}; round them first")
        info = np.iinfo(target)
        lo, hi = arr.min(), arr.max()
        if lo < info.min or hi > info.max:
            raise ShapeError(f"values {lo}..{hi} do not fit in {name} ({info.min}..{info.max})")
    with np.errstate(over="ignore", invalid="ignore"):
        out = arr.astype(target)
    if target.kind == "f" and arr.size and np.count_nonzero(np.isinf(out)) > np.count_nonzero(
            np.isinf(arr)):
        raise ShapeError(f"values up to {np.max(np.abs(arr[np.isfinite(arr)]))} overflow {name} "
                         f"(at most {np.finfo(target).max})")
    return out


def values_for(tensor: "Tensor", array) -> np.ndarray:
    """`array` as new values of `tensor` (same element count, the tensor's dtype)."""
    arr = np.asarray(array, dtype=tensor.dtype)
    if arr.size != tensor.size:
        raise ShapeError(f"cannot write {arr.size} values into a tensor of shape {tensor.shape}")
    return arr.reshape(tensor.shape)


class Tensor:
    """Shape, dtype and storage on one backend. Create with `pxvm.tensor(...)`."""

    __slots__ = ("shape", "dtype", "backend", "storage", "__weakref__")

    def __init__(self, shape, dtype, backend, storage):
        self.shape = tuple(int(s) for s in shape)
        self.dtype = np.dtype(dtype)
        self.backend = backend
        self.storage = storage  # the backend's own: an np.ndarray on numpy, an Allocation on WebGPU

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    def numpy(self) -> np.ndarray:
        """The values as a new numpy array (reads back from the device)."""
        return self.backend.to_numpy(self)

    def write(self, array) -> None:
        """Overwrite the values in place (same element count); ordered before work
        submitted later."""
        self.backend.write(self, array)

    async def numpy_async(self) -> np.ndarray:
        return await self.backend.to_numpy_async(self)

    def __array__(self, dtype=None, copy=None):
        arr = self.numpy()
        return arr if dtype is None else arr.astype(dtype)

    def reshape(self, *shape) -> "Tensor":
        """Same storage, new shape (no copy)."""
        if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
            shape = tuple(shape[0])
        size = self.size
        shape = list(shape)
        if shape.count(-1) == 1:
            known = math.prod(int(s) for s in shape if s != -1)
            shape[shape.index(-1)] = size // max(known, 1)
        if math.prod(int(s) for s in shape) != size:
            raise ShapeError(f"cannot reshape a tensor of shape {self.shape} to {tuple(shape)}")
        storage = self.storage.reshape(shape) if isinstance(self.storage, np.ndarray) else self.storage
        return Tensor(shape, self.dtype, self.backend, storage)

    def prefix(self, rows: int) -> "Tensor":
        """The first `rows` rows (axis 0) as a view of the same storage (no copy)."""
        if not 0 < rows <= self.shape[0]:
            raise ShapeError(f"prefix of {rows} rows of a tensor with {self.shape[0]} rows")
        shape = (rows, *self.shape[1:])
        storage = self.storage[:rows] if isinstance(self.storage, np.ndarray) else self.storage
        return Tensor(shape, self.dtype, self.backend, storage)

    def __repr__(self) -> str:
        return f"Tensor(shape={self.shape}, dtype={dtype_name(self.dtype)}, backend={self.backend.name})"
