"""`Batch`: ops called inside `with batch:` are recorded into one submit; `Graph`: a
chain of ops recorded once and launched again and again.

    batch = Batch()                  # or Batch("numpy"); the same code runs there
    with batch:
        x = batch.upload(array)
        y = pxvm.ops.scale(pxvm.ops.relu(x), 2.0)
    batch.execute()                  # one submit; results nobody consumed are staged
    result = batch.read(y)           # one readback

Inside a batch an op only records its work; nothing runs on the GPU until `execute()`.
On a backend without a recording context (numpy) ops run as they are called.

`Graph(backend, record)` calls `record()` once inside a capturing batch and keeps what
it recorded: every `launch()` submits the same work again (on numpy, `record()` simply
runs again). State that changes between launches lives in tensors the work reads and
writes (a decoding step's token and position).
"""

from __future__ import annotations

import threading
import weakref
from typing import Callable

import numpy as np

from .core import (Backend, CapturedWork, PxvmError, Readback, RecordingContext, Tensor,
                   get_backend)


class BatchStateError(PxvmError):
    """A batch was used out of order (read before execute, recording after execute)."""


class _Active(threading.local):
    def __init__(self):
        self.stack: list[Batch] = []  # batches entered with `with`, innermost last


_active = _Active()


def active_batch() -> "Batch | None":
    """The innermost batch entered with `with` on this thread, if any."""
    return _active.stack[-1] if _active.stack else None


class Batch:
    """Ops recorded for one submit. `timestamps` times it on the GPU, `profile` times
    every dispatch, `capture` keeps the work for a Graph instead of running it."""

    def __init__(self, backend: str | Backend = "auto", *, timestamps: bool = False,
                 profile: bool = False, capture: bool = False):
        self.backend = get_backend(backend)
        #: None where the backend runs ops as they are called (numpy)
        self.context: RecordingContext | None = self.backend.context(
            timestamps=timestamps, profile=profile, capture=capture)
        self.capturing = capture
        self._outputs: list[weakref.ref] = []
        self._consumed: set[int] = set()
        self._alive: list[Tensor] = []  # inputs kept until execute so their ids stay unique
        self._staged: dict[int, tuple[weakref.ref, Readback]] = {}
        self.executed = False

    # ---- recording --------------------------------------------------------------------
    def __enter__(self) -> "Batch":
        self._check_open()
        _active.stack.append(self)
        return self

    def __exit__(self, *exc) -> None:
        _active.stack.remove(self)

    def upload(self, array) -> Tensor:
        """Host data as a tensor on this batch's backend."""
        self._check_open()
        return self.backend.from_numpy(array)

    def adopt(self, value) -> Tensor:
        """`value` as a tensor of this batch's backend (copied there if it is not)."""
        if isinstance(value, Tensor):
            return value if value.backend is self.backend else self.backend.from_numpy(value.numpy())
        return self.backend.from_numpy(value)

    def record(self, run: Callable[[RecordingContext | None], Tensor],
               inputs: list[Tensor]) -> Tensor:
        """Record one op: `run(context)` records its work and returns its result (the
        ops' registry calls this; `inputs` must be tensors of this batch's backend)."""
        self._check_open()
        for t in inputs:
            self._consumed.add(id(t))
        self._alive.extend(inputs)
        out = run(self.context)
        if not any(out is t for t in inputs):  # in-place ops (write_rows) are no results
            self._outputs.append(weakref.ref(out))
        return out

    def flush(self) -> "Batch":
        """Submit what is recorded so far and go on recording into new work, so that the
        GPU starts on it while the host records the rest (a long prompt's layers).
        Results are read as before, after execute(). Nothing to do without a recording
        context, and in timed, profiled or capturing batches (one submit each)."""
        self._check_open()
        if self.context is not None:
            self.context.flush()
        return self

    # ---- running ----------------------------------------------------------------------
    def execute(self) -> "Batch":
        """Run everything recorded, with one submit."""
        self._check_open()
        if self.capturing:
            raise BatchStateError("a capturing batch records dispatches only; call "
                                  "capture() (or use a Graph)")
        if self.context is not None:
            for ref in self._outputs:
                t = ref()
                if t is not None and id(t) not in self._consumed:
                    self._staged[id(t)] = (ref, self.context.stage(t))
            self.context.submit()
        self._close()
        return self

    def capture(self) -> CapturedWork | None:
        """End a batch made with capture=True without running it: its work, to submit
        again and again (None without a recording context, where ops already ran)."""
        self._check_open()
        if not self.capturing:
            raise BatchStateError("capture() needs a batch made with capture=True")
        self._close()
        return None if self.context is None else self.context.capture()

    async def execute_async(self) -> "Batch":
        """As execute(), then await the GPU without blocking the event loop."""
        self.execute()
        await self.backend.wait_async()
        return self

    def read(self, tensor: Tensor) -> np.ndarray:
        """A result's values (staged by execute(), or read back now)."""
        staged = self._take_staged(tensor, "read()")
        if staged is not None:
            return staged.result(tensor.dtype, tensor.size).reshape(tensor.shape)
        return tensor.numpy()

    async def read_async(self, tensor: Tensor) -> np.ndarray:
        staged = self._take_staged(tensor, "read_async()")
        if staged is not None:
            arr = await staged.result_async(tensor.dtype, tensor.size)
            return arr.reshape(tensor.shape)
        return await tensor.numpy_async()

    @property
    def profile(self) -> list[tuple[str, float]] | None:
        """(kernel:entry, GPU seconds) of every dispatch, when made with profile=True."""
        return None if self.context is None else self.context.profile

    @property
    def device_seconds(self) -> float | None:
        """GPU time of the batch when made with timestamps=True (and supported)."""
        return None if self.context is None else self.context.device_seconds

    def _take_staged(self, tensor: Tensor, what: str) -> Readback | None:
        if not self.executed:
            raise BatchStateError(f"{what} before execute(): call batch.execute() first")
        staged = self._staged.pop(id(tensor), None)
        return staged[1] if staged is not None and staged[0]() is tensor else None

    def _close(self) -> None:
        self.executed = True
        self._alive = []

    def _check_open(self) -> None:
        if self.executed:
            raise BatchStateError("this batch was already executed; start a new Batch")


class Graph:
    """`record() -> {name: tensor}` recorded once, run by `launch(*names)`.

    On a backend with a recording context every launch submits the captured work again
    (same buffers, same parameters) and reads back the named tensors in the same submit;
    on numpy `record()` simply runs again. Launches are queued in order, so a caller may
    submit several before reading the first (the GPU then never waits for the host).
    """

    def __init__(self, backend: str | Backend, record: Callable[[], dict[str, Tensor]]):
        self.backend = get_backend(backend)
        self._record = record
        batch = Batch(self.backend, capture=True)
        #: the captured work (None on a backend without a recording context)
        self.captured: CapturedWork | None = None
        self.outputs: dict[str, Tensor] = {}
        if batch.context is not None:
            with batch:
                self.outputs = dict(record())
            self.captured = batch.capture()

    @property
    def dispatches(self) -> int | None:
        """Dispatches per launch (None without a recording context)."""
        return None if self.captured is None else len(self.captured)

    @property
    def scratch_bytes(self) -> int | None:
        """Device memory its intermediate results keep (None where not counted)."""
        return getattr(self.captured, "scratch_bytes", None)

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
        """launch() in two halves: this encodes the work (it may run on another thread),
        the returned PreparedLaunch's submit() queues it. Submits run in the order of
        their submit() calls."""
        if runs is not None and runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        stacked = runs is not None and each_run
        if self.captured is None:
            return PreparedLaunch(lambda: self._run_on_host(names, runs or 1, stacked))
        replay = self.captured.encode([self.outputs[n] for n in names], timestamps,
                                      runs or 1, each_run)
        pending = {n: (self.outputs[n], staged, runs if stacked else None)
                   for n, staged in zip(names, replay.staged)}

        def submit():
            replay.submit()
            return Launch(pending, replay)
        return PreparedLaunch(submit)

    def _run_on_host(self, names, runs: int, stacked: bool) -> "Launch":
        values = []
        for _ in range(runs):
            with Batch(self.backend) as batch:
                outputs = self._record()
            batch.execute()
            values.append({n: outputs[n].numpy() for n in names})
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

    def __init__(self, pending: dict, replay):
        self._pending = pending
        self._replay = replay

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
    def device_seconds(self) -> float | None:
        """GPU time of the run, when launched with timestamps=True (and supported)."""
        return None if self._replay is None else self._replay.device_seconds
