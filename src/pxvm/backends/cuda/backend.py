"""The CUDA backend: tensors in device memory of one NVIDIA GPU, ops as launches of PTX
kernels that pxvm's own Python builders write (ptx/), loaded through the driver
(driver.py). Launches queue on one stream as they are recorded; a Batch's
submit then has nothing left to send, and readbacks copy a result at the point where
they were recorded. Captured work (a Graph: the LLM's decoding step) is kept as a list
of launches and becomes one CUDA graph, launched again and again.
"""

from __future__ import annotations

import functools
import math
import struct
import weakref
from typing import Callable

import numpy as np

from ...core import (Backend, DeviceMemory, PxvmError, RecordingContext, Tensor,
                     as_supported_array, values_for)
from .driver import CudaDevice, CudaGraph, DeviceBuffer, ParameterLayout, get_cuda_device
from .ptx.builder import Kernel, module

#: Threads per block of the grid-stride kernels; blocks per multiprocessor they start.
THREADS = 256
BLOCKS_PER_SM = 8
#: Optional derived forms (weights dequantized to float16 for tensor cores) are kept
#: while this share of the device's memory stays free, for caches, activations and other
#: processes: an H200 (141 GB) keeps Llama-3.1-8B's float16 weights (16 GB) whole, a
#: 24 GB card a Q4_K 8B's in part. Made anew at each use, a weight costs its products
#: more than the products themselves (BENCHMARKS.md, issue 39).
KEEP_FREE = 0.25


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


class PinnedReadback:
    """A tensor's values after some runs of a CUDA graph, copied to page-locked host
    memory (one copy a run, or the last run's only); read once the copies are done."""

    def __init__(self, device: CudaDevice, tensor: Tensor, copies: int):
        self.device = device
        self.source = tensor.storage
        self.nbytes = tensor.storage.nbytes
        self.copies = copies
        self.host = device.host_buffer(self.nbytes * copies)
        self.done = None  # the fence after the copies, once submitted

    def copy(self, index: int) -> None:
        self.device.copy_to_host(self.host, self.source, self.nbytes, index * self.nbytes)

    def result(self, dtype, count: int | None = None) -> np.ndarray:
        self.done.wait()
        data = self.host.array.copy()
        self.host = None  # back to the pool
        arr = data.view(np.dtype(dtype))
        if self.copies > 1:
            arr = arr.reshape(self.copies, -1)
            return arr if count is None else arr[:, :count]
        return arr if count is None else arr[:count]

    async def result_async(self, dtype, count: int | None = None) -> np.ndarray:
        return self.result(dtype, count)


class GraphReplay:
    """`runs` launches of a captured graph, then the outputs' copies to the host."""

    def __init__(self, work: "CapturedLaunches", outputs: list[Tensor], timestamps: bool,
                 runs: int, each_run: bool):
        self.work = work
        self.runs = runs
        self.each_run = each_run
        self.timestamps = timestamps
        self.staged = [PinnedReadback(work.device, t, runs if each_run else 1) for t in outputs]
        self._events = None
        self._seconds: float | None = None

    def submit(self) -> None:
        device = self.work.device
        start = device.event() if self.timestamps else None
        for run in range(self.runs):
            self.work.graph.launch()
            if start is not None and run == self.runs - 1:
                self._events = (start, device.event())
            if self.each_run or run == self.runs - 1:
                for staged in self.staged:
                    staged.copy(run if self.each_run else 0)
        done = device.fence()
        for staged in self.staged:
            staged.done = done

    @property
    def device_seconds(self) -> float | None:
        """From the first launch to the end of the last (copies between runs included)."""
        if self._events is None:
            return self._seconds
        start, end = self._events
        seconds = self.work.device.elapsed(start, end)
        self.work.device.destroy(start, end)
        self._events = None
        self._seconds = seconds
        return seconds


class CapturedLaunches:
    """A capturing context's launches as one CUDA graph, with every buffer they use kept
    alive as long as the graph."""

    def __init__(self, device: CudaDevice, work: list[Callable[[], None]],
                 kept: list[DeviceBuffer], scratch_bytes: int = 0):
        self.device = device
        self.graph: CudaGraph = device.graph(work)
        self.kept = kept
        #: device memory of the intermediate results it keeps (outputs made while capturing)
        self.scratch_bytes = scratch_bytes

    def __len__(self) -> int:
        return self.graph.nodes

    def encode(self, outputs: list[Tensor], timestamps: bool = False, runs: int = 1,
               each_run: bool = True) -> GraphReplay:
        return GraphReplay(self, outputs, timestamps, runs, each_run)


class CudaContext(RecordingContext):
    """What PTX kernels record into: device memory and launches (queued at once, or kept
    for a graph when capturing)."""

    def __init__(self, backend: "CudaBackend", timestamps: bool = False,
                 profile: bool = False, capture: bool = False):
        self.backend = backend
        self.device = backend.device
        self._timed = timestamps
        self._start = self._end = None  # events around the launches of a timed context
        self._profiled: list[tuple[str, object, object]] | None = [] if profile else None
        self._profile_result: list[tuple[str, float]] | None = None
        self._seconds: float | None = None
        #: a capturing context's launches and the buffers they use (None: not capturing)
        self._captured: list[tuple] | None = [] if capture else None
        self._kept: dict[int, DeviceBuffer] = {}
        self._scratch_bytes = 0  # outputs made while capturing
        self._eager = 0  # > 0 while derived forms are made: those run now, not in the graph

    # ---- for kernels ------------------------------------------------------------------
    def empty(self, shape, dtype, what: str = "output") -> Tensor:
        dtype = np.dtype(dtype)
        nbytes = math.prod(shape) * dtype.itemsize
        if self._captured is not None and not self._eager:
            self._scratch_bytes += nbytes
        return Tensor(shape, dtype, self.backend, self.device.alloc(nbytes))

    def tensor(self, array) -> Tensor:
        arr = as_supported_array(array)
        return Tensor(arr.shape, arr.dtype, self.backend, self.device.upload(arr))

    def launch(self, builder: Callable[..., Kernel], builder_args: tuple, args: list,
               grid, block: int = THREADS, shared_bytes: int = 0) -> None:
        """Launch kernel `builder(*builder_args)` with `args` in its parameter order:
        tensors (their device addresses) and Python numbers, typed by the kernel's
        parameter list. `grid`: blocks, an int or (x[, y[, z]])."""
        function, name, layout, pointers = self.backend.kernel(builder, tuple(builder_args))
        if len(layout.offsets) != len(args):
            raise PxvmError(f"kernel {name} takes {len(layout.offsets)} arguments, "
                            f"got {len(args)}")
        values = list(args)
        for i in pointers:
            values[i] = _address(args[i])
        try:
            packed = layout.pack(values)
        except struct.error as exc:
            raise PxvmError(f"kernel {name}: an argument does not fit its type ({exc})") from None
        grid = (grid,) if isinstance(grid, int) else tuple(grid)
        grid += (1,) * (3 - len(grid))  # (x,), (x, y): the rest are 1
        if self._capturing(args):
            # a graph's kernels are programmatic dependent launches (where the GPU has
            # them): each one's launch overlaps the end of the one before, which a
            # decoding step of small kernels spends much of its time on
            self._captured.append(functools.partial(self.device.launch, function, grid,
                                                    (block, 1, 1), packed, shared_bytes,
                                                    dependent=True))
            return
        # events right around the launch: the host's work before it is not the GPU's
        if self._timed and self._start is None:
            self._start = self.device.event()
        start = self.device.event() if self._profiled is not None else None
        self.device.launch(function, grid, (block, 1, 1), packed, shared_bytes)
        if start is not None:
            self._profiled.append((name, start, self.device.event()))

    def copy(self, dst: Tensor, src: Tensor, nbytes: int | None = None,
             dst_offset: int = 0, src_offset: int = 0) -> None:
        """Copy `nbytes` (all of src) between device tensors, at byte offsets."""
        nbytes = src.storage.nbytes if nbytes is None else nbytes
        copy = functools.partial(self.device.copy, dst.storage, src.storage, nbytes,
                                 dst_offset, src_offset)
        if self._capturing([dst, src]):
            self._captured.append(copy)
        else:
            copy()

    def _capturing(self, args) -> bool:
        """Whether work on `args` goes into the graph (then their memory is kept with it)."""
        if self._captured is None or self._eager:
            return False
        for a in args:
            if isinstance(a, Tensor):
                self._kept[id(a.storage)] = a.storage
        return True

    def derived(self, tensor: Tensor, key, make: Callable[[], Tensor],
                optional: bool = False) -> Tensor:
        """A form of `tensor` kernels read faster (a weight repacked), made by `make()`
        (recording its work here) on first use and kept with the tensor's memory until
        the tensor is written or freed. Made at once even while capturing: a weight is
        repacked once, not at every run of a graph. An `optional` form (a speed-up only,
        and large: a weight dequantized) is kept while KEEP_FREE of the device's memory
        stays free (`keeps_optional`), else made anew at each use."""
        self._eager += 1
        try:
            return self.backend.derived(tensor, key, make, optional)
        finally:
            self._eager -= 1

    def counters(self, n: int) -> Tensor:
        """`n` (or more) 32-bit counts, all zero, for a kernel whose blocks count
        themselves and leave the counts zero again (attention's ranges): one buffer for
        every launch, as launches on the stream run one after another."""
        return self.backend.counters(n)

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

    def capture(self) -> CapturedLaunches:
        if self._captured is None:
            raise PxvmError("capture() needs a context made with capture=True")
        launches, self._captured = self._captured, None
        return CapturedLaunches(self.device, launches, list(self._kept.values()),
                                self._scratch_bytes)

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
    def device_seconds(self) -> float | None:
        if self._start is None or self._end is None:
            return self._seconds
        self._seconds = self.device.elapsed(self._start, self._end)
        self.device.destroy(self._start, self._end)
        self._start = self._end = None
        return self._seconds


def _address(arg) -> int:
    """A pointer argument's device address."""
    if not isinstance(arg, Tensor) or not isinstance(arg.storage, DeviceBuffer):
        raise PxvmError(f"a pointer argument must be a CUDA tensor, got {type(arg).__name__}")
    return arg.storage.ptr


class CudaBackend(Backend):
    name = "cuda"
    records = True
    compiles_on_first_use = True
    prompt_graphs = True

    def __init__(self, device: CudaDevice | None = None):
        self.device = device if device is not None else get_cuda_device()
        # id(buffer) -> (a weak reference to it, {key: the tensor derived from it})
        self._derived: dict[int, tuple[weakref.ref, dict]] = {}
        self._kernels: dict[tuple, tuple] = {}  # (builder, its arguments) -> kernel()
        self._counters: Tensor | None = None  # CudaContext.counters'

    def bind_thread(self) -> None:
        self.device.make_current()

    def kernel(self, builder: Callable[..., Kernel], builder_args: tuple) -> tuple:
        """(loaded function, name, its ParameterLayout, the indices of its pointer
        parameters) of kernel `builder(*builder_args)`, looked up once: finding a module
        by its text's hash took longer than a launch."""
        key = (builder, builder_args)
        found = self._kernels.get(key)
        if found is None:
            text, name, types = _ptx(builder, builder_args, self.device.info.arch)
            found = self._kernels[key] = (
                self.device.function(text, name), name, ParameterLayout(types),
                tuple(i for i, t in enumerate(types) if t == "u64"))
        return found

    def counters(self, n: int) -> Tensor:
        """CudaContext.counters' buffer (a larger one where asked for more; graphs keep
        the one they captured)."""
        if self._counters is None or self._counters.size < n:
            self._counters = self.from_numpy(np.zeros(max(n, 1024), np.int32))
        return self._counters

    def derived(self, tensor: Tensor, key, make: Callable[[], Tensor],
                optional: bool = False) -> Tensor:
        """CudaContext.derived's cache."""
        buffer = tensor.storage
        entry = self._derived.get(id(buffer))
        if entry is None or entry[0]() is not buffer:
            entry = (weakref.ref(buffer, lambda _, i=id(buffer): self._forget(i)), {})
            self._derived[id(buffer)] = entry
        found = entry[1].get(key)
        if found is None:
            found = make()
            if optional and not self.keeps_optional():
                return found
            entry[1][key] = found
        return found

    def keeps_derived(self, tensor: Tensor, key) -> bool:
        """Whether `tensor`'s derived form `key` is kept."""
        entry = self._derived.get(id(tensor.storage))
        return entry is not None and entry[0]() is tensor.storage and key in entry[1]

    def keeps_optional(self, nbytes: int = 0) -> bool:
        """Whether an optional derived form `nbytes` larger than those made (0: one just
        made) would be kept: KEEP_FREE of the device's memory free beside it."""
        free, total = self.device.memory_info()
        return free - nbytes >= KEEP_FREE * total

    def _forget(self, buffer_id: int) -> None:
        """A source buffer was freed or written: its derived forms go."""
        self._derived.pop(buffer_id, None)

    def describe(self) -> str:
        i = self.device.info
        return (f"CUDA on {i.name} (compute capability {i.compute_capability[0]}."
                f"{i.compute_capability[1]}, driver {i.driver_version // 1000}."
                f"{i.driver_version % 1000 // 10})")

    def memory_bytes(self) -> DeviceMemory:
        free, total = self.device.memory_info()
        return DeviceMemory(free, total)

    def from_numpy(self, array) -> Tensor:
        arr = as_supported_array(array)
        return Tensor(arr.shape, arr.dtype, self, self.device.upload(arr))

    def zeros(self, shape, dtype) -> Tensor:
        dtype = np.dtype(dtype)
        nbytes = math.prod(int(s) for s in shape) * dtype.itemsize
        return Tensor(tuple(shape), dtype, self, self.device.zeros(nbytes))

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return self.device.read(tensor.storage, tensor.dtype, tensor.size).reshape(tensor.shape)

    def write(self, tensor: Tensor, array) -> None:
        self._forget(id(tensor.storage))  # its repacked forms are stale now
        self.device.write(tensor.storage, values_for(tensor, array))

    def context(self, *, timestamps: bool = False, profile: bool = False,
                capture: bool = False) -> CudaContext:
        return CudaContext(self, timestamps=timestamps, profile=profile, capture=capture)

    async def wait_async(self) -> None:
        self.device.synchronize()
