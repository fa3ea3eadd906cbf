"""Which backends exist and which one runs an op or a model.

Each backend package registers itself here when pxvm is imported (pxvm.backends lists
them, one line each): its name, the names it may also be asked for by, how to make it
(on first use: a GPU backend opens its device then) and, where that is cheaper than
making it, how to tell why it cannot run here.

`get_backend("auto")` gives the first backend of AUTO that works here (WebGPU on the best
hardware adapter, else the fast CPU backend, with a logged reason); language models take
AUTO_MODELS' (CUDA first). "gpu" is WebGPU's other name (the seeds' "--backend gpu"): the
portable GPU backend, on every GPU; CUDA is asked for by name, or by models' "auto".
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Callable

import numpy as np

from . import tuning
from .backend import Backend
from .errors import PxvmError
from .tensor import Tensor

log = logging.getLogger("pxvm.backends")

#: "auto" for ops: WebGPU on the best adapter, else the CPU's SIMD kernels. CUDA is not
#: among them: it has no kernel yet for some general ops (the conformance matrix).
AUTO = ("webgpu", "cpu")
#: "auto" for language models: CUDA first where an NVIDIA driver is (every op a model
#: records has a CUDA kernel, and it decodes and prefills faster than WebGPU there:
#: docs/benchmarks-log.md), then as for ops.
AUTO_MODELS = ("cuda", *AUTO)
#: what a model on "auto" is told when AUTO_MODELS' first backend takes it
AUTO_MODELS_REASON = "auto: CUDA runs language models faster than WebGPU on NVIDIA GPUs"
#: Where an op called on host arrays runs when `pxvm tune` measured the GPU slower than
#: the CPU for inputs of their size (the crossover).
BELOW_CROSSOVER = "cpu"


class UnknownBackendError(PxvmError, ValueError):
    """A backend was asked for by a name pxvm does not know."""


@dataclass(frozen=True)
class Registration:
    """A backend as pxvm.backends registers it."""

    name: str
    make: Callable[[], Backend]           # the backend (shared; PxvmError saying why if none)
    aliases: tuple[str, ...] = ()
    unavailable: Callable[[], str | None] | None = None  # cheaper than make(), where given
    reset: Callable[[], None] | None = None  # forget the shared device (reset_backends)


_registered: dict[str, Registration] = {}
_by_alias: dict[str, str] = {}
_failures: dict[str, str] = {}   # why make() failed, until reset_backends
_warned_fallback = False


def register(name: str, make: Callable[[], Backend], *, aliases: tuple[str, ...] = (),
             unavailable: Callable[[], str | None] | None = None,
             reset: Callable[[], None] | None = None) -> None:
    """Make backend `name` known (pxvm.backends calls this once per backend)."""
    if name in _registered:
        raise ValueError(f"backend {name!r} registered twice")
    _registered[name] = Registration(name, make, tuple(aliases), unavailable, reset)
    for alias in (name, *aliases):
        _by_alias[alias] = name


def registered() -> tuple[str, ...]:
    """The backends' own names, in the order pxvm.backends registers them."""
    return tuple(_registered)


def names() -> tuple[str, ...]:
    """Every name a backend may be asked for by, "auto" first."""
    return ("auto", *_by_alias)


def aliases() -> dict[str, str]:
    """Each name a backend may be asked for by, and the backend it means."""
    return dict(_by_alias)


def canonical(name: str) -> str | None:
    """The backend `name` means (an alias resolved), None if it means none."""
    return _by_alias.get(str(name).lower())


def unavailable_reason(name: str) -> str | None:
    """None when backend `name` works here, else why not (asked of the device once)."""
    entry = _registered.get(canonical(name) or "")
    if entry is None:
        return None
    if entry.unavailable is not None:
        return entry.unavailable()
    if entry.name not in _failures:
        try:
            entry.make()
        except PxvmError as exc:  # why, without the remedy: asking for another backend
            _failures[entry.name] = exc.reason
            return exc.reason
        return None
    return _failures[entry.name]


def get_backend(name: str | Backend = "auto") -> Backend:
    """A backend by name ("auto", or one of names()), or `name` itself if a Backend."""
    if isinstance(name, Backend):
        return name
    key = str(name).lower()
    if key == "auto":
        return _first_available(AUTO)
    found = canonical(key)
    if found is None:
        raise UnknownBackendError(f"unknown backend {name!r}; use one of {', '.join(names())}")
    return _registered[found].make()


def model_backend(name: str | Backend = "auto") -> tuple[Backend, str | None]:
    """The backend a language model runs on, and why when "auto" chose it (AUTO_MODELS)."""
    if isinstance(name, Backend) or str(name).lower() != "auto":
        return get_backend(name), None
    backend = _first_available(AUTO_MODELS)
    if backend.name == AUTO_MODELS[0]:
        return backend, AUTO_MODELS_REASON
    return backend, None


def _first_available(order: tuple[str, ...]) -> Backend:
    """The first backend of `order` that works here (the last is taken as it is); that
    the GPU was passed over for the CPU is logged once, with why."""
    global _warned_fallback
    reason = None
    for name in order[:-1]:
        reason = unavailable_reason(name)
        if reason is None:
            return get_backend(name)
    if reason is not None and not _warned_fallback:
        log.warning("pxvm: no usable GPU, running on the CPU: %s", reason)
        _warned_fallback = True
    return get_backend(order[-1])


def backend_for(op_name: str, inputs, backend) -> Backend:
    """The backend an op runs on: `backend` unless "auto"; for "auto" the inputs' own (a
    tensor already on a backend keeps the op there), else the best one, except where
    `pxvm tune` measured the CPU faster for this op at the inputs' size (uploading and
    reading back cost more than the GPU saves)."""
    if not (isinstance(backend, str) and backend == "auto"):
        return get_backend(backend)
    for x in inputs:
        if isinstance(x, Tensor):
            return x.backend
    target = get_backend("auto")
    if target.name == BELOW_CROSSOVER:
        return target
    threshold = tuning.crossover(target, op_name)
    if threshold is not None and sum(np.size(x) for x in inputs) < threshold:
        return get_backend(BELOW_CROSSOVER)
    return target


def reset_backends() -> None:
    """Drop the shared devices: the next GPU use picks an adapter again (after a device
    loss, or to honour a new PXVM_DEVICE)."""
    global _warned_fallback
    for entry in _registered.values():
        if entry.reset is not None:
            entry.reset()
    _failures.clear()
    _warned_fallback = False
