"""The fast CPU backend (backend.py): host arrays, with kernels compiled to SIMD code by
numba (kernels/) recorded into contexts; ops.py registers them for the ops."""

from __future__ import annotations

from ...core import selection
from . import ops  # noqa: F401 - registers the kernels
from .backend import CpuBackend, CpuContext, cpu_threads, kernel

_backend = CpuBackend()
selection.register("cpu", lambda: _backend)

__all__ = ["CpuBackend", "CpuContext", "cpu_threads", "kernel"]
