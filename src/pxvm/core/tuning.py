"""Choices measured on this device: the kernel configurations `pxvm tune` found fastest
(each candidate checked against the op's reference before it was timed), and for ops
called on host arrays the input size from which the GPU beats the CPU (the crossover).

Kernels ask `choice(backend, name)` and keep their own rule where it says None (not
measured); backends declare what can be tuned with `tunable(...)` next to their kernels:
the candidates, and benchmark cases that make inputs and the expected result. The
measurements are kept on disk, one JSON file per device, keyed by the backend's identity
(adapter and driver) and pxvm's version: another device, driver or pxvm runs on the defaults until tuned again. A file
that does not parse, an entry not of the file's schema (`_validated`; ignored with a warning
naming the file), or a value that is not among a tunable's candidates, is ignored (the
kernels' own rules again), so a stale or edited file can never pick a kernel that does not
exist, nor stop `pxvm info`.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import threading
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Callable

import numpy as np

from .backend import Backend
from .errors import shortened

log = logging.getLogger("pxvm.tuning")

#: Where tuning files go (default: $XDG_CACHE_HOME/pxvm, else ~/.cache/pxvm)
CACHE_ENV = "PXVM_CACHE_DIR"
#: A tuning file larger than this is not read (they hold a few kilobytes)
MAX_FILE_BYTES = 1 << 20


@dataclass(frozen=True)
class TuningCase:
    """One benchmark input of a tunable: `run()` records the op (with the choice being
    measured in force) and returns its result tensor; `expected` is the reference's."""

    label: str
    run: Callable[[], object]
    expected: np.ndarray
    max_nmse: float


@dataclass(frozen=True)
class Tunable:
    """A kernel configuration chosen per device: `candidates` (JSON values), the
    backends it applies to, and `cases(rng, backend)` making the benchmark inputs (a few
    sizes that matter for it)."""

    name: str
    description: str
    candidates: tuple
    backends: tuple[str, ...]
    cases: Callable[[np.random.Generator, Backend], list[TuningCase]]


TUNABLES: dict[str, Tunable] = {}


def tunable(name: str, description: str, candidates, backends, cases) -> Tunable:
    if name in TUNABLES:
        raise ValueError(f"tunable {name!r} declared twice")
    TUNABLES[name] = found = Tunable(name, description, tuple(candidates), tuple(backends),
                                     cases)
    return found


@dataclass
class Tuning:
    """What was measured for one device."""

    identity: str                                   # backend identity + pxvm version
    configs: dict = field(default_factory=dict)     # tunable name -> chosen candidate
    crossovers: dict = field(default_factory=dict)  # op name -> GPU from this many elements
    measured: dict = field(default_factory=dict)    # details `pxvm info` shows

    @property
    def path(self) -> Path:
        digest = hashlib.sha256(self.identity.encode()).hexdigest()[:16]
        return cache_dir() / f"{digest}.json"

    def save(self) -> Path:
        path = self.path
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_suffix(".json.partial")
        partial.write_text(json.dumps({"identity": self.identity, "configs": self.configs,
                                       "crossovers": self.crossovers,
                                       "measured": self.measured}, indent=1))
        partial.replace(path)  # readers never see half a file
        with _lock:
            _loaded[self.identity] = self
        return path


def cache_root() -> Path:
    """pxvm's folder in the user's cache (PXVM_CACHE_DIR, else XDG_CACHE_HOME/pxvm)."""
    root = os.environ.get(CACHE_ENV)
    if not root:
        root = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "pxvm"
    return Path(root)


def cache_dir() -> Path:
    return cache_root() / "tuning"


@functools.lru_cache(maxsize=None)
def pxvm_version() -> str:
    try:
        return metadata.version("pxvm")
    except metadata.PackageNotFoundError:
        return "unknown"


def identity(backend: Backend) -> str:
    return f"{backend.identity()} | pxvm {pxvm_version()}"


_lock = threading.Lock()
_loaded: dict[str, Tuning] = {}


def tuning_for(backend: Backend) -> Tuning:
    """The measurements for `backend`'s device (empty when never tuned)."""
    key = identity(backend)
    with _lock:
        found = _loaded.get(key)
    if found is None:
        found = _read(Tuning(key))
        with _lock:
            _loaded[key] = found
    return found


def _read(empty: Tuning) -> Tuning:
    path = empty.path
    try:
        if not path.is_file():
            return empty
        if path.stat().st_size > MAX_FILE_BYTES:
            raise ValueError(f"larger than {MAX_FILE_BYTES} bytes")
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or data.get("identity") != empty.identity:
            raise ValueError("not this device's file")
        found, ignored = _validated(empty.identity, data)
    except (OSError, ValueError, RecursionError) as exc:  # RecursionError: nesting too deep
        log.warning("pxvm: ignoring the tuning file %s (%s); run `pxvm tune` again", path, exc)
        return empty
    if ignored:
        log.warning("pxvm: ignoring %d entries of the tuning file %s that are not what `pxvm "
                    "tune` writes (%s); run `pxvm tune` again", len(ignored), path,
                    shortened("; ".join(ignored), 300))
    return found


# The tuning file's schema, checked entry by entry (the file is JSON written by `pxvm
# tune`; an edited or damaged entry is dropped, never passed on to a kernel or to `pxvm
# info`): configs name -> a JSON scalar or a flat list of them (a tunable's candidate);
# crossovers op -> elements >= 0; measured key -> a scalar, a flat list, or an object of
# them, "tuned at" a string and "crossover OP" an object whose gpu_faster_from is an
# integer or null.
def _scalar(value) -> bool:
    return value is None or isinstance(value, (str, int, float, bool))


def _flat(value) -> bool:
    return _scalar(value) or (isinstance(value, list) and all(_scalar(v) for v in value))


def _measured_entry(key: str, value) -> bool:
    if key == "tuned at":
        return isinstance(value, str)
    if isinstance(value, dict) and all(_flat(v) for v in value.values()):
        faster = value.get("gpu_faster_from")
        return not key.startswith("crossover ") or faster is None or (
            isinstance(faster, int) and not isinstance(faster, bool))
    return _flat(value) and not key.startswith("crossover ")


def _validated(identity: str, data: dict) -> tuple[Tuning, list[str]]:
    """The file's valid entries as a Tuning, and a description of each one dropped."""
    found, ignored = Tuning(identity), []
    checks = (("configs", found.configs, lambda _, v: _flat(v)),
              ("crossovers", found.crossovers,
               lambda _, v: isinstance(v, int) and not isinstance(v, bool) and v >= 0),
              ("measured", found.measured, _measured_entry))
    for section, kept, valid in checks:
        entries = data.get(section, {})
        if not isinstance(entries, dict):
            ignored.append(f"{section} is not an object")
            continue
        for key, value in entries.items():
            if valid(key, value):
                kept[key] = value
            else:
                ignored.append(f"{section} {shortened(key, 40)!r}")
    return found, ignored


def forget() -> None:
    """Read the tuning files again on next use (tests; after `pxvm tune`)."""
    with _lock:
        _loaded.clear()


_forced = threading.local()


@contextlib.contextmanager
def forcing(name: str, value):
    """Within the block, choice(.., name, ..) is `value` (the tuner measuring it)."""
    stack = getattr(_forced, "values", None)
    if stack is None:
        stack = _forced.values = {}
    saved = stack.get(name, _forced)
    stack[name] = value
    try:
        yield
    finally:
        if saved is _forced:
            del stack[name]
        else:
            stack[name] = saved


def forced(name: str):
    """The value `forcing` holds tunable `name` at (None outside such a block): a kernel
    takes it even where its own rule would not ask for a measured choice, so that the
    tuner and the tests run exactly the candidate they name."""
    return getattr(_forced, "values", {}).get(name)


def choice(backend: Backend, name: str):
    """The configuration tunable `name` takes on `backend`: forced, else measured, else
    None (the kernel's own rule)."""
    held = getattr(_forced, "values", {})
    if name in held:
        return held[name]
    chosen = tuning_for(backend).configs.get(name)
    if isinstance(chosen, list):
        chosen = tuple(chosen)  # JSON has no tuples
    return chosen if chosen in TUNABLES[name].candidates else None


def crossover(backend: Backend, op_name: str) -> int | None:
    """Input elements from which `op_name` runs faster on `backend` than on the CPU
    (None: not measured)."""
    return tuning_for(backend).crossovers.get(op_name)
