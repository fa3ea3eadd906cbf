"""The fast CPU backend: tensors are host arrays, as on numpy, but ops record calls of
SIMD kernels (kernels/, compiled by numba on first use and cached on disk) into
a `CpuContext`, which runs them at submit. A recorded Graph (a decoding step) is then a
list of prepared calls that runs again without the ops' Python work. Ops without a CPU
kernel record their numpy reference, which computes on the same arrays.

Threads: numba's, PXVM_CPU_THREADS of them (default: the cores this process may use).
Kernels and BLAS take turns, never running at once, so the two pools do not compete.
"""

from __future__ import annotations

import importlib
import os
import threading
import time
import weakref
from typing import Callable

import numpy as np

from ...core import HostBackend, PxvmError, RecordingContext, Tensor

#: When True (the tests set it), new outputs start as NaN / -1 / 255, so that a kernel
#: which leaves part of its output unwritten fails the comparison with its reference.
POISON = False


class CpuThreadsError(PxvmError, ValueError):
    """PXVM_CPU_THREADS is not a positive integer."""


_threads_lock = threading.Lock()
_threads: int | None = None


def cpu_threads() -> int:
    """Threads the kernels use: PXVM_CPU_THREADS, else the cores this process may use."""
    asked = os.environ.get("PXVM_CPU_THREADS", "").strip()
    if asked:
        if not asked.isdigit() or int(asked) < 1:
            raise CpuThreadsError(f"PXVM_CPU_THREADS must be a positive integer (threads for "
                                  f"the CPU backend), got {asked!r}; unset it to use every core")
        return int(asked)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


#: Why TBB's library could not be loaded (None: loaded, or not tried yet).
_tbb_problem: str | None = None

# The tbb wheel's library, by platform: the wheel puts it in the environment's lib/ (or
# Library/bin on Windows), where the dynamic loader does not look.
_TBB_LIBRARY = {"linux": "libtbb.so.12", "darwin": "libtbb.12.dylib", "win32": "tbb12.dll"}


def _load_tbb() -> str | None:
    """Load the tbb wheel's library into the process, so that numba's TBB pool (linked
    against it by name) finds it. Returns why it could not, or None."""
    import ctypes
    import sys
    from importlib import metadata
    name = _TBB_LIBRARY.get(sys.platform)
    if name is None:
        return f"no TBB library known for {sys.platform}"
    try:
        files = metadata.distribution("tbb").files or []
    except metadata.PackageNotFoundError:
        return "the tbb package is not installed (pip install tbb)"
    path = next((f.locate() for f in files if f.name == name), None)
    if path is None:
        return f"the tbb package has no {name}"
    try:
        if sys.platform == "win32":
            os.add_dll_directory(str(path.parent))
        ctypes.CDLL(str(path), mode=getattr(ctypes, "RTLD_GLOBAL", 0))
    except OSError as err:
        return f"{path} did not load: {err}"
    return None


def _configure_numba() -> None:
    """Pick numba's threads once, before its first parallel kernel. A parallel region
    costs far less with the TBB or OpenMP thread pools than with numba's own
    (workqueue), and a decoded token runs over a hundred of them. TBB first: with another
    process busy on the same cores, OpenMP's spinning threads slowed a kernel by orders
    of magnitude, TBB's did not (docs/benchmarks-log.md)."""
    global _threads, _tbb_problem
    with _threads_lock:
        if _threads is not None:
            return
        _tbb_problem = _load_tbb()
        import numba  # here, not at import: numba is slow to import
        if "NUMBA_THREADING_LAYER" not in os.environ:
            numba.config.THREADING_LAYER_PRIORITY = ["tbb", "omp", "workqueue"]
        _threads = min(cpu_threads(), numba.config.NUMBA_NUM_THREADS)
        numba.set_num_threads(_threads)


_blas = None


def blas_single_threaded():
    """A context in which BLAS runs on one thread: the kernels give it threads of their
    own (threadpoolctl; entered once per run of the recorded steps)."""
    global _blas
    if _blas is None:
        from threadpoolctl import ThreadpoolController
        _blas = ThreadpoolController()
    return _blas.limit(limits=1, user_api="blas")


def kernel(module: str, entry: str) -> Callable:
    """Function `entry` of kernels/`module`.py (imported, and compiled by numba, on first
    use: numba takes seconds to import and compile, and a process may never need them)."""
    _configure_numba()
    kernel_cache = importlib.import_module(f"{__package__}.kernel_cache")  # imports numba
    return getattr(kernel_cache.import_kernels(f"{__package__}.kernels.{module}"), entry)


class Packed:
    """A weight's packed form, made on first use (`get`) and kept by the backend while
    the raw array lives; writing the tensor drops it."""

    __slots__ = ("backend", "raw", "qtype", "k")

    def __init__(self, backend: "CpuBackend", raw: np.ndarray, qtype: str, k: int):
        self.backend, self.raw, self.qtype, self.k = backend, raw, qtype, k

    def get(self):
        return self.backend.derived(self.raw, ("pack", self.qtype, self.k), lambda raw: kernel(
            "quantized", "pack")(raw, self.qtype, self.k))


class ArrayReadback:
    """A copy of an array taken when the recorded work reaches it (of several runs: the
    copies stacked on a leading axis)."""

    def __init__(self):
        self.value: np.ndarray | None = None
        self.copies = 1

    def result(self, dtype, count: int | None = None) -> np.ndarray:
        """The values (the first `count` of each copy)."""
        if self.value is None:
            raise RuntimeError("read before the work that computes it ran")
        arr = self.value.reshape(self.copies, -1).view(np.dtype(dtype))
        arr = arr if count is None else arr[:, :count]
        return arr if self.copies > 1 else arr[0]

    async def result_async(self, dtype, count: int | None = None) -> np.ndarray:
        return self.result(dtype, count)


Step = tuple[str, Callable[[], object]]  # (label, call)


def _run(steps: list[Step], profile: list | None) -> None:
    with blas_single_threaded():
        if profile is None:
            for _, call in steps:
                call()
            return
        for label, call in steps:
            t0 = time.perf_counter()
            call()
            profile.append((label, time.perf_counter() - t0))


class CapturedCalls:
    """A captured CPU context's calls, run again for every launch."""

    def __init__(self, steps: list[Step]):
        self.steps = steps

    def __len__(self) -> int:
        return len(self.steps)

    def encode(self, outputs: list[Tensor], timestamps: bool = False, runs: int = 1,
               each_run: bool = True) -> "CallsReplay":
        return CallsReplay(self.steps, [t.storage for t in outputs], runs, each_run)


class CallsReplay:
    """`runs` runs of captured calls with copies of the outputs (after every run, or the
    last only); run by submit(), on the caller's thread."""

    def __init__(self, steps: list[Step], outputs: list[np.ndarray], runs: int, each_run: bool):
        self.steps, self.outputs, self.runs, self.each_run = steps, outputs, runs, each_run
        self.staged = [ArrayReadback() for _ in outputs]
        self._seconds: float | None = None

    def submit(self) -> None:
        t0 = time.perf_counter()
        copies: list[list[np.ndarray]] = [[] for _ in self.outputs]
        for run in range(self.runs):
            _run(self.steps, None)
            if self.each_run or run == self.runs - 1:
                for kept, out in zip(copies, self.outputs):
                    kept.append(out.copy())
        for staged, kept in zip(self.staged, copies):
            staged.value = np.stack(kept)
            staged.copies = len(kept)
        self._seconds = time.perf_counter() - t0

    @property
    def device_seconds(self) -> float | None:
        return self._seconds


class CpuContext(RecordingContext):
    """What CPU kernels record into: new host arrays, and calls run in order at submit."""

    def __init__(self, backend: "CpuBackend", timestamps: bool = False, profile: bool = False,
                 capture: bool = False):
        self.backend = backend
        self.steps: list[Step] = []
        self._profile: list[tuple[str, float]] | None = [] if profile else None
        self._timed = timestamps
        self._capturing = capture
        self._seconds: float | None = None

    # ---- for kernels ------------------------------------------------------------------
    def empty(self, shape, dtype) -> Tensor:
        """A new tensor, its values unset (poisoned under the tests)."""
        return self.backend.empty(shape, dtype)

    def tensor(self, array) -> Tensor:
        """Host data as an input of the work being recorded."""
        return self.backend.from_numpy(array)

    def call(self, module: str, entry: str, *args) -> None:
        """Record a call of kernel `entry` of kernels/`module`.py with `args`:
        tensors are passed as their arrays, `Packed` weights as their packed form."""
        fn = kernel(module, entry)
        values = [a.storage if isinstance(a, Tensor) else a for a in args]
        if any(isinstance(v, Packed) for v in values):
            self.steps.append((f"{module}:{entry}", lambda: fn(
                *[v.get() if isinstance(v, Packed) else v for v in values])))
        else:
            self.steps.append((f"{module}:{entry}", lambda: fn(*values)))

    def record_host(self, label: str, run: Callable[[], object]) -> None:
        self.steps.append((label, run))

    def packed(self, weight: Tensor, qtype: str, k: int) -> "Packed":
        """A quantized weight's raw rows as the kernels read them (kernels/quantized.py's
        pack), repacked when a call first needs them and kept with the array."""
        return Packed(self.backend, weight.storage, qtype, k)

    # ---- for a Batch ------------------------------------------------------------------
    def stage(self, tensor: Tensor) -> ArrayReadback:
        readback = ArrayReadback()
        array = tensor.storage

        def copy():
            readback.value = array.copy()
        self.steps.append(("readback", copy))
        return readback

    def submit(self) -> None:
        t0 = time.perf_counter()
        steps, self.steps = self.steps, []
        _run(steps, self._profile)
        if self._timed:
            self._seconds = time.perf_counter() - t0

    def flush(self) -> None:
        if not (self._timed or self._profile is not None or self._capturing):
            self.submit()

    def capture(self) -> CapturedCalls:
        steps, self.steps = self.steps, []
        return CapturedCalls(steps)

    @property
    def profile(self) -> list[tuple[str, float]] | None:
        return self._profile

    @property
    def device_seconds(self) -> float | None:
        """Seconds the timed submit took (the CPU is this backend's device)."""
        return self._seconds


class CpuBackend(HostBackend):
    """Tensors as numpy's (host arrays, copied in and out), ops recorded into contexts."""

    name = "cpu"
    records = True
    compiles_on_first_use = True  # numba compiles each kernel once (then the disk cache)

    def __init__(self):
        # id(array) -> (weak reference to the array, {key: value made from it})
        self._derived: dict[int, tuple[weakref.ref, dict]] = {}

    def describe(self) -> str:
        d = self.details()
        return (f"CPU: numba {d['numba']} kernels on {d['threads']} threads "
                f"({d['thread_pool']}; {d['cpu']}, {d['simd']})")

    def details(self) -> dict:
        """What the kernels run on: threads, thread pool, the CPU LLVM compiles for and
        its widest SIMD, and the BLAS that prompts use."""
        _configure_numba()
        import numba
        from llvmlite import binding
        from threadpoolctl import threadpool_info
        blas = [f"{i['internal_api']} {i['version']}" for i in threadpool_info()
                if i["user_api"] == "blas"][:1]
        pool = _thread_pool()
        return {"numba": numba.__version__, "threads": _threads, "thread_pool": pool,
                "thread_pool_warning": _thread_pool_warning(pool), **_simd(binding),
                "blas": blas[0] if blas else "none found"}

    def empty(self, shape, dtype) -> Tensor:
        dtype = np.dtype(dtype)
        if POISON:
            fill = {"f": np.nan, "i": -1}.get(dtype.kind, np.iinfo(dtype).max if
                                              dtype.kind == "u" else 0)
            arr = np.full(shape, fill, dtype)
        else:
            arr = np.empty(shape, dtype)
        return Tensor(arr.shape, dtype, self, arr)

    def write(self, tensor: Tensor, array) -> None:
        super().write(tensor, array)
        for key, (ref, _) in list(self._derived.items()):
            if ref() is not None and np.shares_memory(ref(), tensor.storage):
                del self._derived[key]

    def derived(self, array: np.ndarray, key, make: Callable[[np.ndarray], object]):
        """make(array), kept per (array, key) while the array lives."""
        entry = self._derived.get(id(array))
        if entry is None or entry[0]() is not array:
            # the callback holds the dict itself: module globals are gone at exit
            entry = (weakref.ref(array, lambda _, i=id(array), d=self._derived: d.pop(i, None)),
                     {})
            self._derived[id(array)] = entry
        kept = entry[1]
        value = kept.get(key)
        if value is None:
            value = kept[key] = make(array)
        return value

    def context(self, *, timestamps: bool = False, profile: bool = False,
                capture: bool = False) -> CpuContext:
        return CpuContext(self, timestamps=timestamps, profile=profile, capture=capture)


def _simd(binding) -> dict:
    """The CPU numba compiles for (the host's, or NUMBA_CPU_NAME's) and its widest SIMD,
    with VNNI (8-bit dot products, which quantized products use where present)."""
    if os.environ.get("NUMBA_CPU_NAME"):
        name = os.environ["NUMBA_CPU_NAME"]
        return {"cpu": f"{binding.get_host_cpu_name()}, compiling for {name} (NUMBA_CPU_NAME)",
                "simd": f"{name}'s"}
    features = binding.get_host_cpu_features()
    simd = next((name for name in ("avx512f", "avx2", "neon", "sse4.2")
                 if features.get(name)), "no wide SIMD")
    vnni = features.get("avx512vnni") or features.get("avxvnni")
    return {"cpu": binding.get_host_cpu_name(),
            "simd": simd + (" with VNNI" if vnni and simd.startswith("avx") else "")}


def _thread_pool_warning(pool: str) -> str | None:
    """Why the kernels do not run on TBB, where pxvm asked for it and could not load it."""
    if pool == "tbb" or "NUMBA_THREADING_LAYER" in os.environ or _tbb_problem is None:
        return None
    return (f"TBB could not be loaded ({_tbb_problem}), so the kernels run on {pool}, "
            "whose threads slow down many-fold while other programs use the cores; "
            "install TBB (pip install tbb) or set PXVM_CPU_THREADS=1 on a busy machine")


def _thread_pool() -> str:
    """numba's thread pool: the one running, else the first of the priority list that
    loads (numba starts it with the first parallel kernel)."""
    import numba
    try:
        return numba.threading_layer()
    except ValueError:
        pass
    for layer in numba.config.THREADING_LAYER_PRIORITY:
        module = "workqueue" if layer == "workqueue" else f"{layer}pool"
        try:
            importlib.import_module(f"numba.np.ufunc.{module}")
            return layer
        except ImportError:
            continue
    return "workqueue"
