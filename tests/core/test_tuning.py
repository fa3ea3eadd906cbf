"""Measured choices (pxvm.core.tuning): kept per device, ignored when stale or wrong, and
the crossover sending small host inputs to the CPU."""

from __future__ import annotations

import json

import numpy as np
import pytest

import pxvm
from pxvm.core import get_backend
from pxvm.core import tuning

LANES = "matmul_quant.webgpu.lanes"


def _write(backend, **fields):
    t = tuning.Tuning(tuning.identity(backend), **fields)
    t.save()
    tuning.forget()
    return t


def test_an_untuned_device_keeps_the_kernels_own_rules(tuning_cache, gpu_device):
    backend = get_backend("webgpu")
    assert tuning.choice(backend, LANES) is None
    assert tuning.crossover(backend, "add") is None


def test_a_tuned_choice_is_used_and_forcing_wins_over_it(tuning_cache, gpu_device):
    backend = get_backend("webgpu")
    _write(backend, configs={LANES: 32})
    assert tuning.choice(backend, LANES) == 32
    with tuning.forcing(LANES, 4):
        assert tuning.choice(backend, LANES) == 4
    assert tuning.choice(backend, LANES) == 32


@pytest.mark.parametrize("text", ["{not json", json.dumps([1, 2]),
                                  json.dumps({"identity": "another device", "configs": {LANES: 32}})])
def test_a_broken_or_foreign_file_is_ignored(tuning_cache, gpu_device, text, caplog):
    backend = get_backend("webgpu")
    path = tuning.Tuning(tuning.identity(backend)).path
    path.parent.mkdir(parents=True)
    path.write_text(text)
    assert tuning.choice(backend, LANES) is None
    assert "ignoring the tuning file" in caplog.text


def test_a_value_that_is_not_a_candidate_is_ignored(tuning_cache, gpu_device):
    backend = get_backend("webgpu")
    _write(backend, configs={LANES: 3}, crossovers={"add": -5, "sum": "big"})
    assert tuning.choice(backend, LANES) is None
    assert tuning.crossover(backend, "add") is None and tuning.crossover(backend, "sum") is None


def test_host_inputs_below_the_crossover_run_on_the_cpu(tuning_cache, gpu_device, rng):
    backend = get_backend("auto")
    assert backend.name == "webgpu"  # the tests' adapter
    _write(backend, crossovers={"add": 1000})
    small = rng.standard_normal(300).astype(np.float32)
    large = rng.standard_normal(600).astype(np.float32)
    out_small = pxvm.ops.add(small, small)
    out_large = pxvm.ops.add(large, large)
    assert out_small.backend.name == "cpu" and out_large.backend.name == "webgpu"
    np.testing.assert_allclose(out_small.numpy(), small * 2, rtol=1e-6)
    np.testing.assert_allclose(out_large.numpy(), large * 2, rtol=1e-6)
    # an explicit backend, or inputs already on a device, are never moved
    assert pxvm.ops.add(small, small, backend="webgpu").backend.name == "webgpu"
    on_gpu = pxvm.tensor(small, backend="webgpu")
    assert pxvm.ops.add(on_gpu, on_gpu).backend.name == "webgpu"


def _write_raw(backend, data) -> "Path":
    path = tuning.Tuning(tuning.identity(backend)).path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(data if isinstance(data, str) else json.dumps(data))
    tuning.forget()
    return path


def test_entries_not_of_the_schema_are_ignored_with_a_warning_naming_the_file(
        tuning_cache, gpu_device, caplog):
    backend = get_backend("webgpu")
    path = _write_raw(backend, {
        "identity": tuning.identity(backend),
        "configs": {LANES: {"nested": [1, {"deeper": 2}]}, "other": [[32]]},
        "crossovers": {"add": 4096, "sum": {"elements": 1}},
        "measured": {"tuned at": {"when": 1}, "crossover add": {"gpu_faster_from": "soon"},
                     "crossover sum": [1, 2], "crossover mul": {"gpu_faster_from": None},
                     LANES: {"seconds": [1.0, 2.0], "note": {"x": 1}}}})
    t = tuning.tuning_for(backend)
    assert tuning.choice(backend, LANES) is None and t.configs == {}
    assert t.crossovers == {"add": 4096}
    assert t.measured == {"crossover mul": {"gpu_faster_from": None}}
    warning = caplog.text
    assert f"ignoring 7 entries of the tuning file {path}" in warning
    for name in (f"configs '{LANES}'", "crossovers 'sum'", "measured 'tuned at'",
                 "measured 'crossover add'"):
        assert name in warning


@pytest.mark.parametrize("text", ["[" * 200_000 + "]" * 200_000,
                                  '{"identity": "x", "configs": ' + "[" * 100_000 + "]" * 100_000 + "}"],
                         ids=["a nested list", "nested configs"])
def test_a_file_nested_past_the_parser_s_depth_is_ignored(tuning_cache, gpu_device, text, caplog):
    backend = get_backend("webgpu")
    path = _write_raw(backend, text)
    assert tuning.choice(backend, LANES) is None
    assert f"ignoring the tuning file {path}" in caplog.text


def test_pxvm_info_shows_the_valid_entries_of_a_mistyped_file(tuning_cache, gpu_device):
    import os
    import subprocess
    import sys

    backend = get_backend("webgpu")
    path = _write_raw(backend, {"identity": tuning.identity(backend), "configs": {LANES: 32},
                                "crossovers": {"add": 4096},
                                "measured": {"tuned at": "2025-01-01 00:00:00",
                                             "crossover add": 7, "crossover mul": "x"}})
    proc = subprocess.run([sys.executable, "-m", "pxvm", "info", "--json"], capture_output=True,
                          text=True, timeout=120, env={**os.environ, tuning.CACHE_ENV: str(tuning_cache)})
    assert proc.returncode == 0, proc.stderr
    assert f"ignoring 2 entries of the tuning file {path}" in proc.stderr
    webgpu = next(t for t in json.loads(proc.stdout)["tuning"] if t["backend"] == "webgpu")
    assert webgpu["configs"] == {LANES: 32} and webgpu["crossovers"] == {"add": 4096}
