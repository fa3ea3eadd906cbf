"""The backend interface: everything the ops, `Batch`, `Graph` and the models use of a
backend. A backend (a package under pxvm.backends) implements `Backend`, and a
`RecordingContext` if it records work to submit rather than running each op at once;
its kernels register under its `name` (`op.kernel(name)`, pxvm.ops.registry) and the
backend itself with pxvm.core.selection.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Callable, ClassVar, NamedTuple, Protocol

import numpy as np

from .tensor import Tensor, as_supported_array, values_for


class Readback(Protocol):
    """A copy of a tensor recorded for reading back, readable once its work is done."""

    def result(self, dtype, count: int | None = None) -> np.ndarray: ...

    async def result_async(self, dtype, count: int | None = None) -> np.ndarray: ...


class Replay(Protocol):
    """Captured work encoded for one submit (of one or several runs)."""

    staged: list[Readback]        # the outputs' readbacks, in the order asked for

    def submit(self) -> None: ...

    @property
    def device_seconds(self) -> float | None: ...


class CapturedWork(Protocol):
    """Work recorded once and submitted again and again (`RecordingContext.capture`)."""

    def __len__(self) -> int: ...   # dispatches per run

    #: (where a backend counts it) device memory of the intermediate results it keeps
    scratch_bytes: int

    def encode(self, outputs: list[Tensor], timestamps: bool = False, runs: int = 1,
               each_run: bool = True) -> Replay:
        """Encode `runs` runs and readbacks of `outputs` (after every run, or after the
        last only when not `each_run`); may run on another thread than the submit."""
        ...


class RecordingContext(ABC):
    """Work recorded for one submit: what op kernels record into (each backend adds the
    methods its kernels use: memory, dispatches) and what a Batch drives."""

    backend: "Backend"

    def record_host(self, label: str, run: Callable[[], object]) -> None:
        """Record a host function run in order with the kernels (backends whose tensors
        are host arrays only)."""
        raise NotImplementedError(f"{type(self).__name__} does not run host functions")

    @abstractmethod
    def stage(self, tensor: Tensor) -> Readback:
        """Record a readback of `tensor` (as it is at this point of the work)."""

    @abstractmethod
    def submit(self) -> None:
        """Queue everything recorded (once)."""

    @abstractmethod
    def flush(self) -> None:
        """Queue what is recorded so far and go on recording into new work (nothing to
        do when timed, profiled or capturing: those are one submit by nature)."""

    @abstractmethod
    def capture(self) -> CapturedWork:
        """End a capturing context: its work, to submit again and again."""

    @property
    def profile(self) -> list[tuple[str, float]] | None:
        """(kernel, device seconds) of every dispatch of a profiled submit."""
        return None

    @property
    def device_seconds(self) -> float | None:
        """Device time of a timed submit: the GPU's clock on a GPU, the host's where the
        host is the device (the CPU backend)."""
        return None


class DeviceMemory(NamedTuple):
    """A device's memory in bytes: what is free now and what it has in all."""

    free: int
    total: int


class Backend(ABC):
    """Where tensors live and ops run."""

    #: "numpy", "webgpu", ...; op kernels register under it
    name: ClassVar[str]
    #: whether ops record their work into a context (`context()`); False: every op runs
    #: its numpy reference as it is called (the numpy backend)
    records: ClassVar[bool] = False
    #: whether tensors are host arrays: an op without a kernel here runs its numpy
    #: reference on them; elsewhere (a GPU) that is a MissingKernelError instead of a
    #: copy in secret
    host_arrays: ClassVar[bool] = False
    #: whether an op's first use compiles something (a warm-up then pays off)
    compiles_on_first_use: ClassVar[bool] = False
    #: whether a language model's prompts run faster replayed as captured graphs than
    #: recorded anew (CUDA and WebGPU: recording a prompt's kernels from Python takes the
    #: host longer than the GPU takes to run them; pxvm.llm.prompts)
    prompt_graphs: ClassVar[bool] = False
    #: the largest tensor one kernel can take, in bytes (None: no bound but memory)
    max_tensor_bytes: int | None = None
    #: whether the device is a software rasteriser on the CPU (lavapipe, SwiftShader):
    #: preparing its kernels takes minutes
    is_software: bool = False

    @abstractmethod
    def describe(self) -> str:
        """A one-line description: the backend and the device it runs on."""

    def identity(self) -> str:
        """The device and driver, as precisely as the backend can tell (what measured
        choices are kept under: pxvm.core.tuning)."""
        return self.describe()

    def memory_bytes(self) -> DeviceMemory | None:
        """The device's free and total memory, or None where the backend cannot tell
        (WebGPU reports no memory)."""
        return None

    @abstractmethod
    def from_numpy(self, array) -> Tensor:
        """Put host data on this backend (a copy)."""

    def zeros(self, shape, dtype) -> Tensor:
        """A new tensor of zeros (a model's KV cache). Backends fill it where it lives;
        this fallback, for those that cannot, copies host zeros in."""
        return self.from_numpy(np.zeros(shape, dtype))

    @abstractmethod
    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        """Read a tensor of this backend back to the host (a copy)."""

    async def to_numpy_async(self, tensor: Tensor) -> np.ndarray:
        """As to_numpy, awaiting the device without blocking the event loop."""
        return self.to_numpy(tensor)

    @abstractmethod
    def write(self, tensor: Tensor, array) -> None:
        """Overwrite a tensor's values in place from the host (same element count),
        ordered before work submitted later."""

    def context(self, *, timestamps: bool = False, profile: bool = False,
                capture: bool = False) -> RecordingContext | None:
        """A new recording context, or None on a backend that runs every op as it is
        called, on the host arrays (the numpy reference backend)."""
        return None

    def bind_thread(self) -> None:
        """Let the calling thread run this backend's work: a thread other than the one
        that made the backend (a serving engine's) calls it first (CUDA makes its
        context current there; the others need nothing)."""

    async def wait_async(self) -> None:
        """Await all work submitted so far without blocking the event loop."""


class HostBackend(Backend):
    """A backend whose tensors are host numpy arrays, copied in and out (numpy's and the
    fast CPU one's)."""

    host_arrays = True

    def memory_bytes(self) -> DeviceMemory | None:
        """The host's memory: MemAvailable (free pages and reclaimable caches) and
        MemTotal of /proc/meminfo; None where there is none (not Linux)."""
        return host_memory()

    def from_numpy(self, array) -> Tensor:
        arr = np.array(as_supported_array(array), copy=True)
        return Tensor(arr.shape, arr.dtype, self, arr)

    def zeros(self, shape, dtype) -> Tensor:
        # numpy's zeros of a large array are pages the OS maps on first write: memory is
        # taken as they are written, not at once
        arr = np.zeros(shape, dtype)
        return Tensor(arr.shape, arr.dtype, self, arr)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        return np.array(tensor.storage, copy=True)

    def write(self, tensor: Tensor, array) -> None:
        tensor.storage[...] = values_for(tensor, array)


def host_memory(meminfo: str = "/proc/meminfo") -> DeviceMemory | None:
    """The host's available and total memory as /proc/meminfo gives them (kB lines), or
    None where it cannot be read."""
    values = {}
    try:
        with open(meminfo) as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key in ("MemAvailable", "MemTotal"):
                    values[key] = int(rest.split()[0]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    if len(values) < 2:
        return None
    return DeviceMemory(values["MemAvailable"], values["MemTotal"])
