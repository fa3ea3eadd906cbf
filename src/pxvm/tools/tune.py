"""`pxvm tune`: measure on this device what pxvm.core.tuning keeps.

For every tunable of the backend: each candidate runs its cases, is checked against the
reference (a candidate that misses is never chosen), then timed (GPU time from
timestamps where the backend has them, else wall time to the result, medians after a
warm-up); the fastest over all cases wins. For ops called on host arrays, the
crossover: the input size from which the op on the GPU (upload, kernel, readback)
beats the fast CPU backend at every size measured above it.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

from .. import ops
from ..batch import Batch
from ..core import Backend, PxvmError, get_backend, tuning
from .bench_ops import median_time

#: ops whose crossover is measured: how to make host inputs of about `size` elements
CROSSOVER_OPS: dict[str, Callable[[np.random.Generator, int], tuple]] = {
    "add": lambda rng, size: (rng.standard_normal(size // 2, np.float32),) * 2,
    "softmax": lambda rng, size: (rng.standard_normal((max(1, size // 256), 256), np.float32),),
    "rmsnorm": lambda rng, size: (rng.standard_normal((max(1, size // 256), 256), np.float32),
                                  rng.standard_normal(256, np.float32)),
    "sum": lambda rng, size: (rng.standard_normal(size, np.float32),),
    "matmul": lambda rng, size: (rng.standard_normal((_side(size), _side(size)), np.float32),) * 2,
}
#: input sizes (elements) the crossovers are measured at
CROSSOVER_SIZES = tuple(1 << s for s in range(8, 23, 2))
QUICK_CROSSOVER_SIZES = tuple(1 << s for s in range(8, 17, 4))


def _side(size: int) -> int:
    return max(1, int((size // 2) ** 0.5))


@dataclass
class Progress:
    """What the tuner reports as it goes (the CLI draws a bar from it)."""

    total: int
    advance: Callable[[str], None] = lambda label: None


def _nmse(got: np.ndarray, expected: np.ndarray) -> float:
    expected = np.asarray(expected, np.float64)
    diff = np.asarray(got, np.float64) - expected
    return float(np.sum(diff * diff) / max(float(np.sum(expected * expected)), 1e-30))


def _time_case(backend: Backend, case: tuning.TuningCase, repeats: int) -> float:
    samples = []
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        with Batch(backend, timestamps=True) as batch:
            out = case.run()
        batch.execute()
        batch.read(out)
        wall = time.perf_counter() - t0
        if i:  # the first run compiles
            samples.append(batch.device_seconds if batch.device_seconds is not None else wall)
    return statistics.median(samples)


def tune_kernels(backend: Backend, result: tuning.Tuning, quick: bool, progress: Progress,
                 only: set[str] | None = None) -> None:
    rng = np.random.default_rng(0)
    repeats = 3 if quick else 10
    for t in tuning.TUNABLES.values():
        if backend.name not in t.backends or (only and t.name not in only):
            continue
        cases = t.cases(rng, backend)
        if quick:
            cases = cases[:1]
        times: dict[str, object] = {}
        best, best_time = None, float("inf")
        for candidate in t.candidates:
            with tuning.forcing(t.name, candidate):
                try:
                    worst = max(_nmse(case.run().numpy(), case.expected) / case.max_nmse
                                for case in cases)
                except PxvmError as exc:  # a kernel this device cannot run
                    times[str(candidate)] = f"cannot run: {exc}"
                    progress.advance(f"{t.name} = {candidate}: cannot run")
                    continue
                if not worst <= 1.0:  # NaN fails too
                    times[str(candidate)] = "wrong result"
                    progress.advance(f"{t.name} = {candidate}: wrong result")
                    continue
                seconds = sum(_time_case(backend, case, repeats) for case in cases)
            times[str(candidate)] = seconds
            if seconds < best_time:
                best, best_time = candidate, seconds
            progress.advance(f"{t.name} = {candidate}")
        if best is not None:
            result.configs[t.name] = best
        result.measured[t.name] = {"description": t.description, "seconds": times,
                                   "cases": [c.label for c in cases]}


def tune_crossovers(backend: Backend, result: tuning.Tuning, quick: bool,
                    progress: Progress) -> None:
    rng = np.random.default_rng(1)
    sizes = QUICK_CROSSOVER_SIZES if quick else CROSSOVER_SIZES
    cpu = get_backend("cpu")
    for name, make in CROSSOVER_OPS.items():
        op = getattr(ops, name)
        rows = []
        for size in sizes:
            inputs = make(rng, size)
            gpu_s = median_time(lambda: op(*inputs, backend=backend).numpy(), 3 if quick else 7)
            cpu_s = median_time(lambda: op(*inputs, backend=cpu).numpy(), 3 if quick else 7)
            rows.append((sum(np.size(x) for x in inputs), gpu_s, cpu_s))
            progress.advance(f"crossover {name} at {size:,}")
        # the GPU from the smallest size where it wins at that size and every larger one
        crossover = None
        for elements, gpu_s, cpu_s in reversed(rows):
            if gpu_s >= cpu_s:
                break
            crossover = elements
        result.crossovers[name] = crossover if crossover is not None else rows[-1][0] + 1
        result.measured[f"crossover {name}"] = {
            "gpu_faster_from": crossover,
            "seconds": [{"elements": e, "gpu": g, "cpu": c} for e, g, c in rows]}


def steps(backend: Backend, quick: bool, crossovers: bool, only: set[str] | None) -> int:
    kernels = sum(len(t.candidates) for t in tuning.TUNABLES.values()
                  if backend.name in t.backends and (not only or t.name in only))
    sizes = QUICK_CROSSOVER_SIZES if quick else CROSSOVER_SIZES
    return kernels + (len(CROSSOVER_OPS) * len(sizes) if crossovers else 0)


def tune(backend: Backend, *, quick: bool = False, crossovers: bool = True,
         only: set[str] | None = None, progress: Progress | None = None) -> tuning.Tuning:
    """Measure and save this device's tuning (merged into what was there)."""
    progress = progress or Progress(steps(backend, quick, crossovers, only))
    current = tuning.tuning_for(backend)
    result = tuning.Tuning(current.identity, dict(current.configs), dict(current.crossovers),
                           dict(current.measured))
    result.measured["tuned at"] = time.strftime("%Y-%m-%d %H:%M:%S")
    result.measured["device"] = backend.describe()
    tune_kernels(backend, result, quick, progress, only)
    if crossovers:
        tune_crossovers(backend, result, quick, progress)
    result.save()
    return result
