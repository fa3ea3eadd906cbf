"""Shared test set-up: pick a WebGPU adapter (lavapipe when there is no GPU), poison every
new device buffer, and fail outright in CI when no adapter exists at all."""

from __future__ import annotations

import contextlib
import os
import random
import sys
import zlib

import numpy as np
import pytest

import pxvm.backends.webgpu
from pxvm.backends.cpu import backend as cpu_backend
from pxvm.backends.cuda import driver as cuda_driver
from pxvm.backends.webgpu import WebGPUContext, runtime as webgpu_runtime
from pxvm.backends.webgpu.ops import subgroups as webgpu_subgroups
from pxvm.backends.webgpu.runtime import device as device_module
from pxvm.backends.webgpu.runtime import get_device, list_adapters
from pxvm.core import selection, tuning


def _pick_test_adapter() -> str | None:
    """Hardware if present (auto), else the first software adapter, named explicitly."""
    if os.environ.get("PXVM_DEVICE"):
        return os.environ["PXVM_DEVICE"]
    try:
        adapters = list_adapters()
    except Exception:
        return None
    if any(not a.is_software for a in adapters):
        return "auto"
    vulkan = [a for a in adapters if a.backend == "Vulkan"] or adapters
    return str(vulkan[0].index) if vulkan else None


TEST_ADAPTER = _pick_test_adapter()
#: Fresh inputs every run; PXVM_TEST_SEED=<n> (printed in the header) reproduces a run.
BASE_SEED = int(os.environ.get("PXVM_TEST_SEED", random.randrange(2**31)))
if TEST_ADAPTER is not None:
    os.environ["PXVM_DEVICE"] = TEST_ADAPTER
device_module.POISON = True  # unwritten outputs read as NaN / -1
cpu_backend.POISON = True
cuda_driver.POISON = True


def pytest_report_header(config):
    seed = f"pxvm: random inputs from PXVM_TEST_SEED={BASE_SEED}"
    if TEST_ADAPTER is None:
        return [seed, "pxvm: NO WebGPU adapter: GPU tests will be skipped (and fail under CI)"]
    dev = get_device()
    return [seed, f"pxvm: GPU tests run on {dev.name} ({dev.description.backend}, "
                  f"{dev.description.adapter_type}; wgpu calls: {dev.calls.name})"]


@pytest.fixture(scope="session")
def gpu_device():
    if TEST_ADAPTER is None:
        pytest.skip("no WebGPU adapter on this machine")
    return get_device()


@pytest.fixture
def fresh_backends(monkeypatch):
    """Forget the shared device and backends for one test, and restore them afterwards:
    the session's other tests keep using theirs (the `gpu_device` fixture's)."""
    monkeypatch.setattr(webgpu_runtime, "_device", None)
    monkeypatch.setattr(webgpu_runtime, "_device_request", None)
    monkeypatch.setattr(pxvm.backends.webgpu, "_backend", None)
    monkeypatch.setattr(selection, "_failures", {})
    monkeypatch.setattr(selection, "_warned_fallback", False)


@pytest.fixture
def tuning_cache(tmp_path, monkeypatch):
    """Tuning files (pxvm.core.tuning) in a fresh folder for one test, read anew."""
    monkeypatch.setenv(tuning.CACHE_ENV, str(tmp_path))
    tuning.forget()
    yield tmp_path
    tuning.forget()


@pytest.fixture
def forced():
    """force(name, value): tunable `name` (pxvm.core.tuning) held at `value` for the rest
    of the test, as the tuner holds a candidate it measures."""
    with contextlib.ExitStack() as stack:
        yield lambda name, value: stack.enter_context(tuning.forcing(name, value))


@pytest.fixture(scope="session")
def cuda_device():
    """The CUDA backend; the test is skipped, saying why, where there is none."""
    reason = selection.unavailable_reason("cuda")
    if reason is not None:
        pytest.skip(f"no CUDA here: {reason}")
    return selection.get_backend("cuda")


def record_dispatches(monkeypatch, describe) -> list:
    """A list that gets describe(kernel, entry, constants, groups) of every WebGPU dispatch
    recorded from now on, where it is not None."""
    seen = []
    record = WebGPUContext.dispatch

    def dispatch(self, kernel, entry, tensors, params, groups, constants=None):
        item = describe(kernel, entry, constants or {}, groups)
        if item is not None:
            seen.append(item)
        return record(self, kernel, entry, tensors, params, groups, constants)

    monkeypatch.setattr(WebGPUContext, "dispatch", dispatch)
    return seen


@pytest.fixture
def dispatched(monkeypatch):
    """The (kernel file, entry point) of every WebGPU dispatch the test records."""
    return record_dispatches(monkeypatch, lambda kernel, entry, *_: (kernel, entry))


@pytest.fixture
def product_entries(monkeypatch):
    """The entry points of the quantized products (matmul_quant.wgsl and its variants) the
    test dispatches."""
    return record_dispatches(monkeypatch, lambda kernel, entry, *_: entry if kernel in (
        "matmul_quant.wgsl", "matmul_quant_subgroups.wgsl", "matmul_quant_columns.wgsl")
        else None)


@pytest.fixture(params=["subgroups", "no subgroups"])
def subgroups(request, monkeypatch, gpu_device) -> bool:
    """Runs a test twice: with WGSL ops taking their subgroup variants (skipped where the
    device has no subgroups), then with the portable kernels; the value says which."""
    wanted = request.param == "subgroups"
    if wanted and not gpu_device.has("subgroup"):
        pytest.skip(f"{gpu_device.name} has no subgroups")
    with tuning.forcing(webgpu_subgroups.TUNED, wanted):
        yield wanted


@pytest.fixture
def rng(request):
    """A generator per test: fresh each run, reproducible with PXVM_TEST_SEED."""
    return np.random.default_rng([BASE_SEED, zlib.crc32(request.node.nodeid.encode())])


def nmse(actual, expected) -> float:
    """sum((a-b)^2) / sum(b^2) over finite entries; NaN/inf positions must agree exactly."""
    a = np.asarray(actual, dtype=np.float64)
    b = np.asarray(expected, dtype=np.float64)
    assert a.shape == b.shape, f"shape {a.shape} != expected {b.shape}"
    nan_a, nan_b = np.isnan(a), np.isnan(b)
    assert np.array_equal(nan_a, nan_b), f"NaN positions differ: {np.argwhere(nan_a != nan_b)[:5]}"
    inf_a, inf_b = np.isinf(a), np.isinf(b)
    assert np.array_equal(inf_a, inf_b) and np.array_equal(a[inf_a], b[inf_b]), "inf entries differ"
    finite = ~(nan_b | inf_b)
    denom = float(np.sum(b[finite] ** 2))
    num = float(np.sum((a[finite] - b[finite]) ** 2))
    if denom == 0.0:
        return num
    return num / denom


def assert_close(actual, expected, threshold: float):
    err = nmse(actual, expected)
    assert err <= threshold, f"NMSE {err:.3e} exceeds {threshold:.0e}"


NMSE_ELEMENTWISE = 1e-7
NMSE_F16 = 1e-6
NMSE_LONG = 5e-4
ODD_SIZES = (1, 7, 33, 257)


def pytest_terminal_summary(terminalreporter):
    """The conformance matrix (test_conformance.py), as the run found it: how each op runs
    on each backend (Op.implementation; "+ gaps": some cases have no kernel, GAPS), "-"
    where the backend was not here or the cell did not run."""
    module = sys.modules.get("test_conformance")
    if module is None or not module.MATRIX:
        return
    matrix, backends = module.MATRIX, module.BACKENDS
    ops = sorted({op for op, _ in matrix})
    width = max(len(op) for op in ops) + 2
    write = terminalreporter.write_line
    terminalreporter.section("conformance matrix (kernel / decomposed / reference / missing)")
    write("op".ljust(width) + "".join(b.ljust(18) for b in backends))
    for op in ops:
        cells = []
        for b in backends:
            how = matrix.get((op, b), "-")
            partial = (op, b) in module.GAPS and how not in ("missing", "-")
            cells.append((how + " + gaps" if partial else how).ljust(18))
        write(op.ljust(width) + "".join(cells))
    gaps = sorted(f"{op} on {b}" + ("" if cases is None else f" (cases {', '.join(map(str, cases))})")
                  for (op, b), cases in module.GAPS.items())
    write(f"expected gaps ({len(gaps)}): " + "; ".join(gaps))
