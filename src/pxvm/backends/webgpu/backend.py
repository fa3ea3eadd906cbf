"""The WebGPU backend: tensors in device buffers, ops recorded as WGSL dispatches into a
`WebGPUContext` and submitted by the runtime (runtime/)."""

from __future__ import annotations

import math
from typing import Protocol

import numpy as np

from ...core import Backend, RecordingContext, Tensor, as_supported_array, values_for
from .runtime import Device, DispatchList, get_device, workgroup_grid
from .runtime.params import KernelParams


class WgslDevice(Protocol):
    """What a WebGPUContext needs of its device: the runtime's Device, or the browser
    plans' stand-in that records instead of running (pxvm.web.plans)."""

    max_groups: int

    @property
    def is_software(self) -> bool: ...

    def has(self, feature: str) -> bool: ...

    def alloc(self, nbytes: int, what: str = "tensor"): ...

    def upload(self, array: np.ndarray, what: str = "tensor"): ...

    def pipeline(self, kernel: str, entry: str = "main", constants: dict | None = None): ...

    def recorder(self) -> "WgslRecorder": ...


class WgslRecorder(Protocol):
    """What a WebGPUContext records dispatches into (a runtime recorder, or a plan's);
    `groups` is always (x, y, z), already spread over the device's max_groups."""

    def dispatch(self, pipeline, buffers: list, params: bytes | None,
                 groups: tuple[int, int, int]) -> None: ...


class CapturedDispatches:
    """A captured WebGPU context's work: the runtime's DispatchList, encoded again for
    every run."""

    def __init__(self, dispatches: DispatchList, scratch_bytes: int = 0):
        self.dispatches = dispatches
        #: device memory of the intermediate results it keeps (outputs made while capturing)
        self.scratch_bytes = scratch_bytes

    def __len__(self) -> int:
        return len(self.dispatches)

    def encode(self, outputs: list[Tensor], timestamps: bool = False, runs: int = 1,
               each_run: bool = True):
        return self.dispatches.encode([t.storage for t in outputs], timestamps, runs, each_run)


class WebGPUContext(RecordingContext):
    """What WGSL kernels record into: memory on the device, its features, and dispatches
    of a kernel file's entry point with typed parameters."""

    def __init__(self, backend, device: WgslDevice, recorder: WgslRecorder,
                 one_buffer: bool = False, capturing: bool = False):
        self.backend = backend
        self.device = device
        self.recorder = recorder
        # timed, profiled and captured work is one command buffer by nature: no flush
        self.one_buffer = one_buffer
        self._scratch_bytes = 0 if capturing else None  # outputs made while capturing

    # ---- for kernels ------------------------------------------------------------------
    def empty(self, shape, dtype, what: str = "output") -> Tensor:
        """A new tensor on the device, its values unset."""
        dtype = np.dtype(dtype)
        nbytes = math.prod(int(s) for s in shape) * dtype.itemsize
        alloc = self.device.alloc(max(nbytes, 4), what)
        alloc.nbytes = nbytes
        if self._scratch_bytes is not None:
            self._scratch_bytes += nbytes
        return Tensor(shape, dtype, self.backend, alloc)

    def tensor(self, array) -> Tensor:
        """Upload host data as an input of the work being recorded."""
        arr = as_supported_array(array)
        return Tensor(arr.shape, arr.dtype, self.backend, self.device.upload(arr))

    def has(self, feature: str) -> bool:
        return self.device.has(feature)

    @property
    def is_software(self) -> bool:
        """True on CPU rasterisers (lavapipe, SwiftShader), where kernels may pick a
        variant with fewer barriers."""
        return self.device.is_software

    def dispatch(self, kernel: str, entry: str, tensors: list[Tensor],
                 params: KernelParams | None, groups, constants: dict | None = None) -> None:
        """Record `entry` of kernel file `kernel` over `groups` workgroups (an int is
        spread over x and y). Bindings: the tensors in order, then the parameter block."""
        pipeline = self.device.pipeline(kernel, entry, constants)
        if params is not None:
            if (type(params), kernel) not in _checked:
                params.check(kernel)
                _checked.add((type(params), kernel))
            params = params.pack()
        if isinstance(groups, int):
            groups = workgroup_grid(groups, self.device.max_groups)
        self.recorder.dispatch(pipeline, [t.storage for t in tensors], params, groups)

    # ---- for a Batch ------------------------------------------------------------------
    def stage(self, tensor: Tensor):
        return self.recorder.stage(tensor.storage)

    def submit(self) -> None:
        self.recorder.submit()

    def flush(self) -> None:
        if not self.one_buffer:
            self.recorder.submit()
            self.recorder = self.device.recorder()

    def capture(self) -> CapturedDispatches:
        return CapturedDispatches(self.recorder.capture(), self._scratch_bytes or 0)

    @property
    def profile(self) -> list[tuple[str, float]] | None:
        return self.recorder.profile

    @property
    def device_seconds(self) -> float | None:
        return self.recorder.device_seconds

    @property
    def dispatches(self) -> int:
        """Dispatches recorded since the last flush."""
        return self.recorder.dispatches


#: (params class, kernel file) pairs already checked against the file's struct
_checked: set[tuple[type, str]] = set()


class WebGPUBackend(Backend):
    name = "webgpu"
    records = True
    compiles_on_first_use = True
    # with prompts' products and attention tiled, recording a prompt takes the host longer
    # than the GPU takes to run it (docs/benchmarks-log.md, issue 19); a replay only encodes
    prompt_graphs = True

    def __init__(self, device: Device | None = None):
        self.device = device if device is not None else get_device()

    def describe(self) -> str:
        d = self.device.description
        return f"WebGPU on {d.name} ({d.adapter_type}, {d.backend})"

    def identity(self) -> str:
        info = getattr(self.device.description.adapter, "info", None) or {}
        return f"{self.describe()}, driver {info.get('description') or 'unknown'}"

    @property
    def max_tensor_bytes(self) -> int:
        return self.device.max_binding

    @property
    def is_software(self) -> bool:
        return self.device.is_software

    def from_numpy(self, array) -> Tensor:
        # float16 tensors are bytes to any device: kernels that compute in f16 need
        # shader-f16 (the device refuses their WGSL without it), those that unpack
        # the values to f32 (matmul_f16.wgsl) do not
        arr = as_supported_array(array)
        return Tensor(arr.shape, arr.dtype, self, self.device.upload(arr))

    def zeros(self, shape, dtype) -> Tensor:
        dtype = np.dtype(dtype)
        nbytes = math.prod(int(s) for s in shape) * dtype.itemsize
        return Tensor(tuple(shape), dtype, self, self.device.zeros(nbytes))

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return self.device.read(tensor.storage, tensor.dtype, tensor.size).reshape(tensor.shape)

    async def to_numpy_async(self, tensor: Tensor) -> np.ndarray:
        flat = await self.device.read_async(tensor.storage, tensor.dtype, tensor.size)
        return flat.reshape(tensor.shape)

    def write(self, tensor: Tensor, array) -> None:
        self.device.write(tensor.storage, values_for(tensor, array))

    def context(self, *, timestamps: bool = False, profile: bool = False,
                capture: bool = False) -> WebGPUContext:
        recorder = self.device.recorder(timestamps=timestamps, profile=profile, capture=capture)
        return WebGPUContext(self, self.device, recorder,
                             one_buffer=timestamps or profile or capture, capturing=capture)

    async def wait_async(self) -> None:
        await self.device.wait_async()
