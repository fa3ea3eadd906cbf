"""The CUDA backend: tensors in device memory of one NVIDIA GPU, ops as launches of PTX
kernels that pxvm's own Python builders write (pxvm.kernels.ptx), loaded through the
driver (pxvm.runtime.cuda). Launches queue on one stream as they are recorded; a Batch's
submit then has nothing left to send, and readbacks copy a result at the point where
they were recorded.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable

import numpy as np

from ..kernels.ptx.builder import Kernel, module
from ..runtime.cuda import CudaDevice, DeviceBuffer, get_cuda_device
from ..runtime.errors import PxvmError
from .base import Backend, RecordingContext
from .tensor import Tensor, as_supported_array, values_for

#: Threads per block of the grid-stride kernels; blocks per multiprocessor they start.
THREADS = 256
BLOCKS_PER_SM = 8


class CudaGraphsNotYetError(PxvmError):
    """Captured work (Graph) is not on the CUDA backend yet."""


def _graphs_not_yet() -> CudaGraphsNotYetError:
    return CudaGraphsNotYetError(
        "captured work (Graph, recorded decoding steps) is not on the CUDA backend yet; "
        "run it on webgpu, cpu or numpy")


@functools.lru_cache(maxsize=None)
def _ptx(builder: Callable[..., Kernel], args: tuple, arch: str) -> tuple[str, str, tuple]:
    """(module text, entry name, parameter types) of the kernel `builder(*args)` for
    `arch`."""
    kernel = builder(*args)
    return module([kernel], arch), kernel.name, tuple(t for _, t in kernel.param_types)


class DeviceReadback:
    """A tensor's values copied on the device where the readback was recorded, read to
    the host when asked."""

    def __init__(self, device: CudaDevice, tensor: Tensor):
        self.device = device
        self.copy = device.alloc(tensor.storage.nbytes)
        device.copy(self.copy, tensor.storage, tensor.storage.nbytes)

    def result(self, dtype, count: int | None = None) -> np.ndarray:
        dtype = np.dtype(dtype)
        count = self.copy.nbytes // dtype.itemsize if count is None else count
        return self.device.read(self.copy, dtype, count)

    async def result_async(self, dtype, count: int | None = None) -> np.ndarray:
        return self.result(dtype, count)


class CudaContext(RecordingContext):
    """What PTX kernels record into: device memory and launches (queued at once)."""

    def __init__(self, backend: "CudaBackend", timestamps: bool = False,
                 profile: bool = False):
        self.backend = backend
        self.device = backend.device
        self._timed = timestamps
        self._start = self._end = None  # events around the launches of a timed context
        self._profiled: list[tuple[str, object, object]] | None = [] if profile else None
        self._profile_result: list[tuple[str, float]] | None = None
        self._seconds: float | None = None

    # ---- for kernels ------------------------------------------------------------------
    def empty(self, shape, dtype, what: str = "output") -> Tensor:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return Tensor(shape, dtype, self.backend, self.device.alloc(nbytes))

    def tensor(self, array) -> Tensor:
        arr = as_supported_array(array)
        return Tensor(arr.shape, arr.dtype, self.backend, self.device.upload(arr))

    def launch(self, builder: Callable[..., Kernel], builder_args: tuple, args: list,
               grid, block: int = THREADS, shared_bytes: int = 0) -> None:
        """Launch kernel `builder(*builder_args)` with `args` in its parameter order:
        tensors (their device addresses) and Python numbers, typed by the kernel's
        parameter list. `grid`: blocks, an int or (x, y, z)."""
        text, name, types = _ptx(builder, tuple(builder_args), self.device.info.arch)
        if len(types) != len(args):
            raise PxvmError(f"kernel {name} takes {len(types)} arguments, got {len(args)}")
        packed = self.device.pack([_value(a, t) for a, t in zip(args, types)])
        grid = (grid, 1, 1) if isinstance(grid, int) else tuple(grid)
        function = self.device.function(text, name)
        # events right around the launch: the host's work before it is not the GPU's
        if self._timed and self._start is None:
            self._start = self.device.event()
        start = self.device.event() if self._profiled is not None else None
        self.device.launch(function, grid, (block, 1, 1), packed, shared_bytes)
        if start is not None:
            self._profiled.append((name, start, self.device.event()))

    def derived(self, tensor: Tensor, key, make: Callable[[], Tensor]) -> Tensor:
        """A form of `tensor` kernels read faster (a weight repacked), made by `make()`
        (recording its work here) on first use and kept with the tensor's memory until
        the tensor is written or freed."""
        return self.backend.derived(tensor, key, make)

    def stride_grid(self, groups: int) -> int:
        """Blocks for a grid-stride loop over `groups` items: enough to fill the GPU."""
        limit = self.device.info.multiprocessors * BLOCKS_PER_SM
        return max(1, min(limit, -(-groups // THREADS)))

    # ---- for a Batch ------------------------------------------------------------------
    def stage(self, tensor: Tensor) -> DeviceReadback:
        self._stop_timing()  # readbacks are not the work being timed
        return DeviceReadback(self.device, tensor)

    def submit(self) -> None:
        self._stop_timing()

    def _stop_timing(self) -> None:
        if self._start is not None and self._end is None:
            self._end = self.device.event()

    def flush(self) -> None:
        pass  # launches are queued as they are recorded

    def capture(self):
        raise _graphs_not_yet()

    @property
    def profile(self) -> list[tuple[str, float]] | None:
        if self._profiled is None:
            return None
        if self._profile_result is None:  # read once, then the events are freed
            self._profile_result = [(name, self.device.elapsed(a, b))
                                    for name, a, b in self._profiled]
            self.device.destroy(*(e for _, a, b in self._profiled for e in (a, b)))
        return self._profile_result

    @property
    def gpu_seconds(self) -> float | None:
        if self._start is None or self._end is None:
            return self._seconds
        self._seconds = self.device.elapsed(self._start, self._end)
        self.device.destroy(self._start, self._end)
        self._start = self._end = None
        return self._seconds


def _value(arg, ptx_type: str):
    if ptx_type == "u64":
        if not isinstance(arg, Tensor) or not isinstance(arg.storage, DeviceBuffer):
            raise PxvmError(f"a pointer argument must be a CUDA tensor, got {type(arg).__name__}")
        return np.uint64(arg.storage.ptr)
    return {"u32": np.uint32, "s32": np.int32, "f32": np.float32}[ptx_type](arg)


class CudaBackend(Backend):
    name = "cuda"
    compiles_on_first_use = True

    def __init__(self, device: CudaDevice | None = None):
        self.device = device if device is not None else get_cuda_device()
        # id(buffer) -> (a weak reference to it, {key: the tensor derived from it})
        self._derived: dict[int, tuple[weakref.ref, dict]] = {}

    def derived(self, tensor: Tensor, key, make: Callable[[], Tensor]) -> Tensor:
        """CudaContext.derived's cache."""
        buffer = tensor.storage
        entry = self._derived.get(id(buffer))
        if entry is None or entry[0]() is not buffer:
            entry = (weakref.ref(buffer, lambda _, i=id(buffer), d=self._derived: d.pop(i, None)),
                     {})
            self._derived[id(buffer)] = entry
        found = entry[1].get(key)
        if found is None:
            found = entry[1][key] = make()
        return found

    def describe(self) -> str:
        i = self.device.info
        return (f"CUDA on {i.name} (compute capability {i.compute_capability[0]}."
                f"{i.compute_capability[1]}, driver {i.driver_version // 1000}."
                f"{i.driver_version % 1000 // 10})")

    def from_numpy(self, array) -> Tensor:
        arr = as_supported_array(array)
        return Tensor(arr.shape, arr.dtype, self, self.device.upload(arr))

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return self.device.read(tensor.storage, tensor.dtype, tensor.size).reshape(tensor.shape)

    def write(self, tensor: Tensor, array) -> None:
        self._derived.pop(id(tensor.storage), None)  # its repacked forms are stale now
        self.device.write(tensor.storage, values_for(tensor, array))

    def context(self, *, timestamps: bool = False, profile: bool = False,
                capture: bool = False) -> CudaContext:
        if capture:
            raise _graphs_not_yet()
        return CudaContext(self, timestamps=timestamps, profile=profile)

    async def wait_async(self) -> None:
        self.device.synchronize()
