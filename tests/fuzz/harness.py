"""The fuzzing harness: every fuzz case runs its target in a worker process of its own,
bounded in memory (RLIMIT_AS, set before the worker imports anything heavy) and in time
(the parent kills a worker whose case outlasts the limit), so that a case that would
grow without bound or hang is seen as such instead of taking the machine down.

A case's outcome is one of:
- "ok": the target returned;
- "error": it raised a PxvmError (pxvm's clear errors), whose message is kept;
- "crash": any other exception (a traceback: a bug), MemoryError included, since a
  bounded program never reaches the memory limit;
- "hang": it ran past the time limit and was killed.

`PXVM_FUZZ_EXAMPLES` sets the cases per fuzz test (default: a few dozen, for CI); the
long run (scripts/fuzz.sh) sets 10,000 and collects each kind's figures in
artifacts/fuzz/<kind>.json.

A fuzz test module names its input KIND, imports `FUZZ` and the `fuzz_worker` fixture
from here (a conftest.py here would shadow tests/conftest.py) and runs each case as
`assert_clear(fuzz_worker.run(target, data))`.
"""

from __future__ import annotations

import importlib
import json
import multiprocessing
import os
import resource
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

#: Hypothesis examples per fuzz test.
EXAMPLES = int(os.environ.get("PXVM_FUZZ_EXAMPLES", "40"))
#: Every case's limits: the issue's bounds (no hang past 30 s, no process over 1.5 GB).
CASE_SECONDS = 30.0
MEMORY_BYTES = 1536 << 20
STATS_DIR = Path(__file__).resolve().parents[2] / "artifacts" / "fuzz"
#: Settings of every fuzz test: EXAMPLES cases, no deadline (the worker's time limit is
#: the bound), no example database (each run explores afresh).
FUZZ = settings(max_examples=EXAMPLES, deadline=None, database=None,
                suppress_health_check=list(HealthCheck))


@dataclass
class Outcome:
    kind: str          # "ok", "error", "crash" or "hang"
    message: str = ""  # the PxvmError's message, or the crash's traceback
    seconds: float = 0.0


def _serve(conn, memory_bytes: int) -> None:
    """The worker: limit the address space, then run (module, function, args) requests."""
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    from pxvm.core.errors import PxvmError  # noqa: PLC0415 - after the limit is set

    while True:
        request = conn.recv()
        if request is None:
            return
        module, name, args = request
        t0 = time.perf_counter()
        try:
            getattr(importlib.import_module(module), name)(*args)
            kind, message = "ok", ""
        except PxvmError as exc:
            kind, message = "error", str(exc)
        except BaseException:  # noqa: BLE001 - every other exception is the finding
            kind, message = "crash", traceback.format_exc()
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        conn.send((kind, message, time.perf_counter() - t0, peak))


@dataclass
class FuzzStats:
    """A fuzz test's figures: cases by outcome, the slowest case, the workers' peak RSS."""

    kind: str
    outcomes: dict = field(default_factory=lambda: {"ok": 0, "error": 0, "crash": 0, "hang": 0})
    slowest_seconds: float = 0.0
    peak_rss_bytes: int = 0
    findings: list = field(default_factory=list)  # the first crashes and hangs, for a report

    @property
    def cases(self) -> int:
        return sum(self.outcomes.values())

    def save(self) -> None:
        STATS_DIR.mkdir(parents=True, exist_ok=True)
        data = asdict(self) | {"cases": self.cases}
        (STATS_DIR / f"{self.kind}.json").write_text(json.dumps(data, indent=1) + "\n")


class BoundedWorker:
    """Runs fuzz targets one at a time in a spawned process under the case limits; a
    worker that hung or crashed is replaced by a fresh one."""

    def __init__(self, kind: str, seconds: float = CASE_SECONDS,
                 memory_bytes: int = MEMORY_BYTES):
        self.stats = FuzzStats(kind)
        self.seconds = seconds
        self.memory_bytes = memory_bytes
        self._context = multiprocessing.get_context("spawn")
        self._process = None
        self._conn = None

    def _start(self) -> None:
        parent, child = self._context.Pipe()
        self._process = self._context.Process(target=_serve, args=(child, self.memory_bytes),
                                              daemon=True)
        self._process.start()
        child.close()
        self._conn = parent

    def _stop(self, kill: bool) -> None:
        if self._process is None:
            return
        if kill:
            self._process.kill()
        else:
            try:
                self._conn.send(None)
            except (BrokenPipeError, OSError):
                pass
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()
        self._process = self._conn = None

    def run(self, target, *args) -> Outcome:
        """Run `target(*args)` (a module-level function) in the worker."""
        if self._process is None:
            self._start()
        t0 = time.perf_counter()
        self._conn.send((target.__module__, target.__name__, args))
        if not self._conn.poll(self.seconds):
            self._stop(kill=True)
            outcome = Outcome("hang", f"killed after {self.seconds:.0f} s", self.seconds)
        else:
            try:
                kind, message, seconds, peak = self._conn.recv()
            except EOFError:  # the worker died (a signal, or the memory limit in C code)
                self._stop(kill=True)
                kind, message, seconds, peak = "crash", "the worker process died", \
                    time.perf_counter() - t0, 0
            self.stats.peak_rss_bytes = max(self.stats.peak_rss_bytes, peak)
            outcome = Outcome(kind, message, seconds)
            if kind == "crash":
                self._stop(kill=True)
        self.stats.outcomes[outcome.kind] += 1
        self.stats.slowest_seconds = max(self.stats.slowest_seconds, outcome.seconds)
        if outcome.kind in ("crash", "hang") and len(self.stats.findings) < 20:
            self.stats.findings.append(f"{target.__name__}{_short(args)}: {outcome.message}")
        return outcome

    def close(self) -> FuzzStats:
        self._stop(kill=False)
        self.stats.save()
        return self.stats


def mutate_bytes(draw, data: bytearray, at: int) -> bytearray:
    """One byte-level mutation of `data` at position `at` (a hypothesis `draw`): a bit
    pattern flipped (most often), bytes inserted or deleted, or the rest cut off."""
    kind = draw(st.sampled_from(["flip", "flip", "insert", "delete", "truncate"]))
    if kind == "flip":
        data[at] ^= draw(st.integers(1, 255))
    elif kind == "insert":
        data[at:at] = draw(st.binary(min_size=1, max_size=16))
    elif kind == "delete":
        del data[at:at + draw(st.integers(1, 64))]
    else:
        del data[at:]
    return data


def _short(args) -> str:
    text = repr(args)
    return text if len(text) <= 200 else text[:200] + "..."


def assert_clear(outcome: Outcome) -> None:
    """The property every fuzz case must have: a result, or one clear error."""
    assert outcome.kind in ("ok", "error"), outcome.message
    if outcome.kind == "error":
        assert outcome.message.strip(), "an error without a message"


@pytest.fixture(scope="module")
def fuzz_worker(request):
    """A BoundedWorker for the module's KIND; its figures are saved when the module ends."""
    worker = BoundedWorker(request.module.KIND)
    yield worker
    worker.close()
