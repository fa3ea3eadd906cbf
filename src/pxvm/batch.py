"""`Batch` (alias `GpuCommandBatch`): record a chain of ops, run it with one submit.

    batch = Batch()                 # or Batch("cpu"); the same code runs on numpy
    x = batch.upload(array)
    y = batch.scale(batch.relu(x), 2.0)
    batch.execute()                 # one submit; results nobody consumed are staged
    result = batch.read(y)          # one readback

Queuing an op only encodes it into the batch's command buffer: nothing runs on the
GPU until `execute()`. On the numpy backend ops run as they are queued.

`Graph` records a chain once and runs it again and again (a decoding step): on the GPU
the dispatches are captured with their buffers and only re-encoded per run; state that
changes between runs lives in tensors the chain reads and writes.
"""

from __future__ import annotations

import weakref
from typing import Callable

import numpy as np

from .backends import get_backend
from .ops.registry import REGISTRY
from .runtime.errors import PxvmError
from .tensor import Tensor


class BatchStateError(PxvmError):
    """A batch was used out of order (read before execute, queue after execute)."""


class Batch:
    def __init__(self, backend="auto", timestamps: bool = False, profile: bool = False,
                 capture: bool = False):
        self.backend = get_backend(backend)
        self._gpu = hasattr(self.backend, "context")
        self._ctx = self.backend.context(timestamps, profile, capture) if self._gpu else None
        self._outputs: list[weakref.ref] = []
        self._consumed: set[int] = set()
        self._alive: list[Tensor] = []  # inputs kept until execute so their ids stay unique
        self._staged: dict[int, object] = {}
        self.executed = False

    # ---- queueing -------------------------------------------------------------
    def upload(self, array) -> Tensor:
        self._check_open()
        return self.backend.from_numpy(array)

    def queue(self, name: str, *args, **kwargs) -> Tensor:
        """Queue op `name` (any op of pxvm.ops) on this batch."""
        self._check_open()
        op = REGISTRY.get(name)
        if op is None:
            raise AttributeError(f"no op named {name!r}; known ops: {', '.join(sorted(REGISTRY))}")
        inputs, params = op.bind(args, kwargs)
        tensors = [x if isinstance(x, Tensor) and x.backend is self.backend
                   else self.backend.from_numpy(np.asarray(x)) for x in inputs]
        op.infer(tensors, params)
        for t in tensors:
            self._consumed.add(id(t))
        self._alive.extend(tensors)
        if self._gpu:
            out = op.gpu(self._ctx, *tensors, **params)
        else:
            out = self.backend.run(op, tensors, params)
        if not any(out is t for t in tensors):  # in-place ops (write_rows) are no results
            self._outputs.append(weakref.ref(out))
        return out

    def __getattr__(self, name: str):
        if name.startswith("_") or name not in REGISTRY:
            raise AttributeError(name)
        return lambda *args, **kwargs: self.queue(name, *args, **kwargs)

    def flush(self) -> "Batch":
        """Submit what is queued so far and go on queueing into a new command buffer, so
        that the GPU starts on it while the host records the rest (a long prompt's
        layers). Results are read as before, after execute(). Nothing to do on the numpy
        backend, and in timed, profiled or capturing batches (one command buffer each)."""
        self._check_open()
        if self._gpu:
            self._ctx.flush()
        return self

    # ---- running --------------------------------------------------------------
    def _stage_leaves(self):
        for ref in self._outputs:
            t = ref()
            if t is not None and id(t) not in self._consumed:
                self._staged[id(t)] = (ref, self._ctx.recorder.stage(t.storage))

    def execute(self) -> "Batch":
        """Run everything queued with one submit."""
        self._check_open()
        if self._gpu:
            self._stage_leaves()
            self._ctx.recorder.submit()
        self.executed = True
        self._alive = []
        return self

    def capture(self):
        """End a batch created with capture=True without running it: its dispatches as a
        runtime DispatchList (None on the numpy backend, where ops already ran)."""
        self._check_open()
        self.executed = True
        self._alive = []
        return self._ctx.recorder.capture() if self._gpu else None

    async def execute_async(self) -> "Batch":
        """As execute(), then await the GPU without blocking the event loop."""
        self.execute()
        if self._gpu:
            await self.backend.device.wait_async()
        return self

    def read(self, tensor: Tensor) -> np.ndarray:
        if not self.executed:
            raise BatchStateError("read() before execute(): call batch.execute() first")
        staged = self._staged.pop(id(tensor), None)
        if staged is not None and staged[0]() is tensor:
            return staged[1].result(tensor.dtype, tensor.size).reshape(tensor.shape)
        return tensor.numpy()

    async def read_async(self, tensor: Tensor) -> np.ndarray:
        if not self.executed:
            raise BatchStateError("read_async() before execute(): call batch.execute() first")
        staged = self._staged.pop(id(tensor), None)
        if staged is not None and staged[0]() is tensor:
            arr = await staged[1].result_async(tensor.dtype, tensor.size)
            return arr.reshape(tensor.shape)
        return await tensor.numpy_async()

    @property
    def profile(self) -> list[tuple[str, float]] | None:
        """(kernel:entry, GPU seconds) of every dispatch, when created with profile=True."""
        return self._ctx.recorder.profile if self._gpu else None

    @property
    def gpu_seconds(self) -> float | None:
        """GPU time of the batch when created with timestamps=True and supported."""
        return self._ctx.recorder.gpu_seconds if self._gpu else None

    def _check_open(self):
        if self.executed:
            raise BatchStateError("this batch was already executed; start a new Batch")


GpuCommandBatch = Batch


class Graph:
    """`record(batch) -> {name: tensor}` captured once, run by `launch(*names)`.

    On the GPU every launch submits the captured dispatches again (same buffers, same
    parameter blocks) and reads back the named tensors in the same submit; on the numpy
    backend `record` simply runs again. Launches are queued in order, so a caller may
    submit several before reading the first (the GPU then never waits for the host).
    """

    def __init__(self, backend, record: Callable[[Batch], dict]):
        self.backend = get_backend(backend)
        self._record = record
        self._list = None
        if hasattr(self.backend, "context"):
            b = Batch(self.backend, capture=True)
            self.outputs = dict(record(b))
            self._list = b.capture()

    @property
    def dispatches(self) -> int | None:
        """Dispatches per launch (None on the numpy backend)."""
        return None if self._list is None else len(self._list)

    def launch(self, *names: str, timestamps: bool = False, runs: int | None = None,
               each_run: bool = True) -> "Launch":
        """Run once; the returned Launch reads the named outputs back. With `runs` = k,
        run k times in a row in one submit, and each output comes back with a leading
        axis of k: its value after each run; with each_run=False, its value after the
        last run only (no copies between runs, which split the GPU's work)."""
        return self.prepare(*names, timestamps=timestamps, runs=runs,
                            each_run=each_run).submit()

    def prepare(self, *names: str, timestamps: bool = False, runs: int | None = None,
                each_run: bool = True) -> "PreparedLaunch":
        """launch() in two halves: this encodes the command buffer (on the GPU; it may run
        on another thread), the returned PreparedLaunch's submit() queues it. Submits
        run in the order of their submit() calls."""
        if runs is not None and runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        stacked = runs is not None and each_run
        if self._list is None:
            return PreparedLaunch(lambda: self._run_on_host(names, runs or 1, stacked))
        rec = self._list.encode([self.outputs[n].storage for n in names], timestamps,
                                runs or 1, each_run)
        pending = {n: (self.outputs[n], st, runs if stacked else None)
                   for n, st in zip(names, rec.staged)}

        def submit():
            rec.submit()
            return Launch(pending, rec)
        return PreparedLaunch(submit)

    def _run_on_host(self, names, runs: int, stacked: bool) -> "Launch":
        values = []
        for _ in range(runs):
            b = Batch(self.backend)
            outs = self._record(b)
            b.execute()
            values.append({n: outs[n].numpy() for n in names})
        if not stacked:
            return Launch(values[-1], None)
        return Launch({n: np.stack([v[n] for v in values]) for n in names}, None)

    def run(self, *names: str) -> dict[str, np.ndarray]:
        return self.launch(*names).result()


class PreparedLaunch:
    """A Graph launch encoded but not yet queued; `submit()` queues it (once)."""

    def __init__(self, submit: Callable[[], "Launch"]):
        self._submit = submit
        self._launch: Launch | None = None

    def submit(self) -> "Launch":
        if self._launch is not None:
            raise RuntimeError("this launch was already submitted")
        self._launch = self._submit()
        return self._launch


class Launch:
    """One submitted run of a Graph; `result()` waits for it and returns its readbacks."""

    def __init__(self, pending: dict, recorder):
        self._pending = pending
        self._recorder = recorder

    def result(self) -> dict[str, np.ndarray]:
        out = {}
        for name, item in self._pending.items():
            if isinstance(item, tuple):
                tensor, staged, runs = item
                shape = tensor.shape if runs is None else (runs, *tensor.shape)
                item = staged.result(tensor.dtype, tensor.size).reshape(shape)
            out[name] = item
        self._pending = out
        return out

    @property
    def gpu_seconds(self) -> float | None:
        """GPU time of the run, when launched with timestamps=True and supported."""
        return None if self._recorder is None else self._recorder.gpu_seconds
