"""The CUDA driver, through NVIDIA's `cuda-bindings`: a context on one GPU, memory, PTX
modules (compiled by the driver: no nvcc, NVRTC or LLVM), launches on one stream, and
events. Everything the CUDA backend (pxvm.backends.cuda) needs and nothing more.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import struct
import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ...core.errors import OutOfDeviceMemoryError, PxvmError


#: Fill new allocations with 0xff bytes (NaN floats, -1 integers), so that a kernel that
#: leaves outputs unwritten fails its tests (they set it; PXVM_POISON=1 elsewhere).
POISON = os.environ.get("PXVM_POISON") == "1"
#: The first compute capability with programmatic dependent launch.
DEPENDENT_LAUNCH_MAJOR = 9


class CudaUnavailableError(PxvmError):
    """No CUDA here: the bindings, the driver or a GPU is missing (the message says which)."""


class CudaError(PxvmError):
    """A CUDA driver call failed."""


@functools.cache  # looked up once: a launch asks for it several times (a failure is not kept)
def _driver():
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise CudaUnavailableError(
            "the cuda-bindings package is not installed (pip install cuda-bindings)") from exc
    return driver


def _check(result, what: str):
    """The values of a driver call's result tuple after its status; CudaError if failed."""
    cu = _driver()
    status, *values = result if isinstance(result, tuple) else (result,)
    if status != cu.CUresult.CUDA_SUCCESS:
        _, text = cu.cuGetErrorString(status)
        raise CudaError(f"{what} failed: {status.name}"
                        + (f" ({text.decode()})" if isinstance(text, bytes) else ""))
    return values[0] if len(values) == 1 else tuple(values)


@dataclass(frozen=True)
class DeviceInfo:
    """What `pxvm info` says of a CUDA device."""

    ordinal: int
    name: str
    compute_capability: tuple[int, int]
    memory_bytes: int
    multiprocessors: int
    clock_mhz: int
    memory_clock_mhz: int
    driver_version: int  # e.g. 13000 for 13.0

    @property
    def arch(self) -> str:
        return f"sm_{self.compute_capability[0]}{self.compute_capability[1]}"


#: Allocations are rounded up to this many bytes, so that similar sizes share the pool.
GRANULE = 512


class DeviceBuffer:
    """Device memory of `nbytes` from the device's pool, returned to it when the last
    reference goes."""

    def __init__(self, device: "CudaDevice", nbytes: int):
        self.device = device
        self.nbytes = nbytes
        self.capacity = -(-max(nbytes, 4) // GRANULE) * GRANULE
        self.ptr = device.take(self.capacity)
        if POISON:
            _check(_driver().cuMemsetD8Async(self.ptr, 0xFF, self.capacity, device.stream),
                   "cuMemsetD8Async")

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            self.device.give_back(ptr, self.capacity)


class HostBuffer:
    """Page-locked host memory of `nbytes` from the device's pool (device-to-host copies
    into it are asynchronous: the host goes on while they run), as a uint8 array."""

    def __init__(self, device: "CudaDevice", nbytes: int):
        self.device = device
        self.capacity = -(-max(nbytes, 4) // GRANULE) * GRANULE
        self.ptr = device.take_host(self.capacity)
        self.array = np.frombuffer((ctypes.c_uint8 * self.capacity).from_address(self.ptr),
                                   np.uint8)[:nbytes]

    def __del__(self):
        ptr, self.ptr = getattr(self, "ptr", 0), 0
        if ptr:
            self.device.give_back_host(ptr, self.capacity)


class Fence:
    """A point in the stream's work the host can wait for (an event without timing,
    freed with this object)."""

    def __init__(self, device: "CudaDevice"):
        self.event = device.event(timing=False)

    def wait(self) -> None:
        _check(_driver().cuEventSynchronize(self.event), "cuEventSynchronize")

    def __del__(self):
        if getattr(self, "event", None) is not None:
            _driver().cuEventDestroy(self.event)


class CudaGraph:
    """Work captured from the stream into a CUDA graph, instantiated once: one `launch()`
    queues it all, with the driver's launch cost paid once per graph. `work`: functions
    that queue launches or copies on the device's stream."""

    def __init__(self, device: "CudaDevice", work: list[Callable[[], None]]):
        cu = _driver()
        self.device = device
        self.nodes = len(work)
        # relaxed: another thread's driver calls (an encode's page-locked buffer) during
        # the capture must not invalidate it
        _check(cu.cuStreamBeginCapture(
            device.stream, cu.CUstreamCaptureMode.CU_STREAM_CAPTURE_MODE_RELAXED),
            "cuStreamBeginCapture")
        try:
            for queue in work:
                queue()
        finally:
            graph = _check(cu.cuStreamEndCapture(device.stream), "cuStreamEndCapture")
        self._graph = graph
        self._exec = _check(cu.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
        _check(cu.cuGraphUpload(self._exec, device.stream), "cuGraphUpload")

    def launch(self) -> None:
        _check(_driver().cuGraphLaunch(self._exec, self.device.stream), "cuGraphLaunch")

    def __del__(self):
        try:
            cu = _driver()
        except CudaUnavailableError:  # the interpreter is shutting down: the driver frees it
            return
        if getattr(self, "_exec", None) is not None:
            cu.cuGraphExecDestroy(self._exec)
        if getattr(self, "_graph", None) is not None:
            cu.cuGraphDestroy(self._graph)


def _init() -> int:
    """Initialise the driver; the number of CUDA devices."""
    cu = _driver()
    try:
        _check(cu.cuInit(0), "cuInit")
    except RuntimeError as exc:  # the bindings could not load libcuda
        raise CudaUnavailableError(f"no NVIDIA driver: {exc}") from exc
    return int(_check(cu.cuDeviceGetCount(), "cuDeviceGetCount"))


def _device_info(ordinal: int) -> DeviceInfo:
    cu = _driver()
    handle = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
    attr = cu.CUdevice_attribute

    def get(name):
        return int(_check(cu.cuDeviceGetAttribute(getattr(attr, name), handle), name))

    name = _check(cu.cuDeviceGetName(256, handle), "cuDeviceGetName")
    return DeviceInfo(
        ordinal, name.split(b"\0")[0].decode(),
        (get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR"),
         get("CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR")),
        int(_check(cu.cuDeviceTotalMem(handle), "cuDeviceTotalMem")),
        get("CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT"),
        get("CU_DEVICE_ATTRIBUTE_CLOCK_RATE") // 1000,
        get("CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE") // 1000,
        int(_check(cu.cuDriverGetVersion(), "cuDriverGetVersion")))


def list_cuda_devices() -> list[DeviceInfo]:
    """Every CUDA device the driver sees; CudaUnavailableError says why there are none."""
    count = _init()
    if count == 0:
        raise CudaUnavailableError("the NVIDIA driver sees no CUDA device")
    return [_device_info(i) for i in range(count)]


class ParameterLayout:
    """A kernel's parameters (PTX types u64, u32, s32, f32, in order) as a launch passes
    them: the values packed into one buffer in the C layout, and an array of pointers to
    each value, which is what the driver takes."""

    _CODES = {"u64": "Q", "u32": "I", "s32": "i", "f32": "f"}

    def __init__(self, types: tuple[str, ...]):
        codes = "".join(self._CODES[t] for t in types)
        self.struct = struct.Struct("@" + codes)
        self.offsets = np.array(
            [struct.calcsize("@" + codes[:i + 1]) - struct.calcsize("@" + c)
             for i, c in enumerate(codes)], np.uint64)

    def pack(self, values: list) -> tuple[int, tuple]:
        """(the address of the pointer array, what it points to, kept alive with it)."""
        data = ctypes.create_string_buffer(self.struct.pack(*values), self.struct.size)
        pointers = self.offsets + np.uint64(ctypes.addressof(data))
        return pointers.__array_interface__["data"][0], (data, pointers)


class CudaDevice:
    """One GPU's primary context and a stream; launches are asynchronous on the stream."""

    def __init__(self, ordinal: int = 0):
        count = _init()
        if ordinal >= count:
            raise CudaUnavailableError(f"no CUDA device {ordinal} (the driver sees {count})")
        cu = _driver()
        self.handle = _check(cu.cuDeviceGet(ordinal), "cuDeviceGet")
        self.context = _check(cu.cuDevicePrimaryCtxRetain(self.handle), "cuDevicePrimaryCtxRetain")
        self.make_current()
        self.stream = _check(cu.cuStreamCreate(0), "cuStreamCreate")
        self.info = _device_info(ordinal)
        self._modules: dict[str, object] = {}
        self._functions: dict[tuple[str, str], object] = {}
        # freed buffers by capacity, reused before asking the driver: cuMemAlloc of a
        # large buffer takes longer than the kernels that fill it
        self._pool: dict[int, list[int]] = {}
        self._host_pool: dict[int, list[int]] = {}  # page-locked host memory, the same way
        self._host_lock = threading.Lock()  # encodes take host buffers on a worker thread
        self._shared_allowed: dict[int, int] = {}  # function -> dynamic shared bytes allowed

    def make_current(self) -> None:
        _check(_driver().cuCtxSetCurrent(self.context), "cuCtxSetCurrent")

    # ---- memory -------------------------------------------------------------------------
    def alloc(self, nbytes: int) -> DeviceBuffer:
        return DeviceBuffer(self, nbytes)

    def take(self, capacity: int) -> int:
        """A device address of `capacity` bytes: a pooled one, else a new allocation (the
        pool emptied first if the device is full)."""
        free = self._pool.get(capacity)
        if free:
            return free.pop()
        cu = _driver()
        status, ptr = cu.cuMemAlloc(capacity)
        if status == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY and self._pool:
            self.synchronize()
            self.trim()
            status, ptr = cu.cuMemAlloc(capacity)
        if status == cu.CUresult.CUDA_ERROR_OUT_OF_MEMORY:
            raise OutOfDeviceMemoryError(
                f"out of device memory allocating {capacity:,} bytes on {self.info.name}: "
                "free tensors you no longer need, use smaller batches, or a device with "
                "more memory")
        return int(_check((status, ptr), f"cuMemAlloc of {capacity:,} bytes"))

    def memory_info(self) -> tuple[int, int]:
        """(free, total) bytes of device memory: the driver's (cuMemGetInfo), free
        counting the buffers the pool keeps (take() frees them when the device is full)."""
        self.make_current()
        free, total = _check(_driver().cuMemGetInfo(), "cuMemGetInfo")
        pooled = sum(capacity * len(ptrs) for capacity, ptrs in self._pool.items())
        return int(free) + pooled, int(total)

    def give_back(self, ptr: int, capacity: int) -> None:
        """A buffer's memory back to the pool (work queued on it runs first: one stream)."""
        self._pool.setdefault(capacity, []).append(ptr)

    def trim(self) -> None:
        """Free the pooled memory to the driver."""
        for ptrs in self._pool.values():
            for ptr in ptrs:
                _driver().cuMemFree(ptr)
        self._pool.clear()

    def host_buffer(self, nbytes: int) -> HostBuffer:
        return HostBuffer(self, nbytes)

    def take_host(self, capacity: int) -> int:
        with self._host_lock:
            free = self._host_pool.get(capacity)
            if free:
                return free.pop()
        self.make_current()  # maybe a worker thread's first driver call
        return int(_check(_driver().cuMemAllocHost(capacity),
                          f"cuMemAllocHost of {capacity:,} bytes"))

    def give_back_host(self, ptr: int, capacity: int) -> None:
        with self._host_lock:
            self._host_pool.setdefault(capacity, []).append(ptr)

    def zeros(self, nbytes: int) -> DeviceBuffer:
        """A new buffer of `nbytes` zero bytes, set on the device (queued on the stream)."""
        buf = self.alloc(nbytes)
        _check(_driver().cuMemsetD8Async(buf.ptr, 0, buf.capacity, self.stream),
               "cuMemsetD8Async")
        return buf

    def upload(self, array: np.ndarray) -> DeviceBuffer:
        array = np.ascontiguousarray(array)
        buf = self.alloc(array.nbytes)
        self.write(buf, array)
        return buf

    def write(self, buf: DeviceBuffer, array: np.ndarray, offset: int = 0) -> None:
        """Host data into the buffer, after the work queued so far (synchronous)."""
        array = np.ascontiguousarray(array)
        if array.nbytes:
            self.synchronize()
            _check(_driver().cuMemcpyHtoD(buf.ptr + offset, array.ctypes.data, array.nbytes),
                   "cuMemcpyHtoD")

    def read(self, buf: DeviceBuffer, dtype, count: int, offset: int = 0) -> np.ndarray:
        """`count` values from the buffer once the queued work is done."""
        out = np.empty(count, dtype)
        self.synchronize()
        if out.nbytes:
            _check(_driver().cuMemcpyDtoH(out.ctypes.data, buf.ptr + offset, out.nbytes),
                   "cuMemcpyDtoH")
        return out

    def copy(self, dst: DeviceBuffer, src: DeviceBuffer, nbytes: int, dst_offset: int = 0,
             src_offset: int = 0) -> None:
        """Device-to-device copy, queued on the stream."""
        if nbytes:
            _check(_driver().cuMemcpyDtoDAsync(dst.ptr + dst_offset, src.ptr + src_offset,
                                               nbytes, self.stream), "cuMemcpyDtoDAsync")

    def copy_to_host(self, dst: HostBuffer, src: DeviceBuffer, nbytes: int,
                     offset: int = 0) -> None:
        """Device-to-host copy into page-locked memory at `offset`, queued on the stream."""
        if nbytes:
            _check(_driver().cuMemcpyDtoHAsync(dst.ptr + offset, src.ptr, nbytes, self.stream),
                   "cuMemcpyDtoHAsync")

    # ---- kernels ------------------------------------------------------------------------
    def function(self, ptx: str, name: str):
        """Entry `name` of a PTX module (loaded, so compiled by the driver, once)."""
        key = hashlib.sha256(ptx.encode()).hexdigest()
        found = self._functions.get((key, name))
        if found is None:
            module = self._modules.get(key)
            if module is None:
                module = _check(_driver().cuModuleLoadData(ptx.encode() + b"\0"),
                                "cuModuleLoadData (compiling PTX)")
                self._modules[key] = module
            found = _check(_driver().cuModuleGetFunction(module, name.encode()),
                           f"cuModuleGetFunction {name}")
            self._functions[(key, name)] = found
        return found

    def launch(self, function, grid: tuple[int, int, int], block: tuple[int, int, int],
               packed: tuple, shared_bytes: int = 0, dependent: bool = False) -> None:
        """Queue a launch of `function` with its ParameterLayout.pack()ed arguments.
        `dependent`: as a programmatic dependent launch (sm_90 on), which may start while
        the launch before it finishes; its kernel waits for that one's results (the
        builder's griddepcontrol)."""
        if shared_bytes:  # the 48 KiB without asking count the kernel's static memory too
            self._allow_shared(function, shared_bytes)
        cu = _driver()
        if dependent and self.info.compute_capability[0] >= DEPENDENT_LAUNCH_MAJOR:
            config = cu.CUlaunchConfig()
            config.gridDimX, config.gridDimY, config.gridDimZ = grid
            config.blockDimX, config.blockDimY, config.blockDimZ = block
            config.sharedMemBytes = shared_bytes
            config.hStream = self.stream
            config.attrs = [self._dependent_attribute]
            config.numAttrs = 1
            _check(cu.cuLaunchKernelEx(config, function, packed[0], 0),
                   "cuLaunchKernelEx")
            return
        _check(cu.cuLaunchKernel(function, *grid, *block, shared_bytes, self.stream,
                                 packed[0], 0), "cuLaunchKernel")

    @functools.cached_property
    def _dependent_attribute(self):
        cu = _driver()
        attribute = cu.CUlaunchAttribute()
        attribute.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
        attribute.value.programmaticStreamSerializationAllowed = 1
        return attribute

    def graph(self, work: list[Callable[[], None]]) -> CudaGraph:
        return CudaGraph(self, work)

    def _allow_shared(self, function, shared_bytes: int) -> None:
        """Allow a function `shared_bytes` of dynamic shared memory: without it, its
        dynamic and static shared memory together may not pass 48 KiB."""
        if self._shared_allowed.get(int(function), 0) < shared_bytes:
            cu = _driver()
            _check(cu.cuFuncSetAttribute(
                function, cu.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                shared_bytes), f"allowing {shared_bytes:,} bytes of shared memory")
            self._shared_allowed[int(function)] = shared_bytes

    # ---- ordering and time --------------------------------------------------------------
    def synchronize(self) -> None:
        _check(_driver().cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def event(self, timing: bool = True):
        """An event recorded now on the stream (one that cannot time: cheaper)."""
        cu = _driver()
        flags = (cu.CUevent_flags.CU_EVENT_DEFAULT if timing
                 else cu.CUevent_flags.CU_EVENT_DISABLE_TIMING)
        ev = _check(cu.cuEventCreate(flags), "cuEventCreate")
        _check(cu.cuEventRecord(ev, self.stream), "cuEventRecord")
        return ev

    def fence(self) -> Fence:
        """A fence after the work queued so far."""
        return Fence(self)

    @staticmethod
    def destroy(*events) -> None:
        for ev in events:
            _check(_driver().cuEventDestroy(ev), "cuEventDestroy")

    @staticmethod
    def elapsed(start, end) -> float:
        """Seconds between two recorded events (waits for the second)."""
        cu = _driver()
        _check(cu.cuEventSynchronize(end), "cuEventSynchronize")
        return float(_check(cu.cuEventElapsedTime(start, end), "cuEventElapsedTime")) / 1e3


_lock = threading.Lock()


@functools.lru_cache(maxsize=None)
def _device(ordinal: int) -> CudaDevice:
    return CudaDevice(ordinal)


def get_cuda_device(ordinal: int = 0) -> CudaDevice:
    """The shared device `ordinal` (made on first use); CudaUnavailableError says why not."""
    with _lock:
        return _device(ordinal)


def cuda_unavailable_reason() -> str | None:
    """None where CUDA works here, else why not."""
    try:
        get_cuda_device()
    except (CudaUnavailableError, CudaError) as exc:
        return str(exc)
    return None
