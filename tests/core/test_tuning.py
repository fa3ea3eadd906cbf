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
