"""`pxvm tune` (pxvm.tools.tune): every candidate is checked against its reference before
it is timed, the fastest correct one is kept per device, and `pxvm info` shows it."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

import pxvm
from pxvm.core import get_backend
from pxvm.tools import tune as tuner
from pxvm.core import tuning


@pytest.fixture
def wrong_when_fast(monkeypatch, rng):
    """A tunable whose candidate "fast" gives a wrong result (scaled by 3, not 2)."""
    x = rng.standard_normal(4096).astype(np.float32)

    def cases(rng, backend):
        tx = backend.from_numpy(x)
        run = lambda: pxvm.ops.scale(  # noqa: E731
            tx, factor=3.0 if tuning.choice(backend, "test.wrong") == "fast" else 2.0)
        return [tuning.TuningCase("x * 2", run, x.astype(np.float64) * 2, 1e-10)]

    monkeypatch.setitem(tuning.TUNABLES, "test.wrong",
                        tuning.Tunable("test.wrong", "a test", ("fast", "right"), ("webgpu",),
                                       cases))


def test_a_candidate_with_a_wrong_result_is_never_chosen(tuning_cache, gpu_device, wrong_when_fast):
    backend = get_backend("webgpu")
    result = tuner.tune(backend, quick=True, crossovers=False, only={"test.wrong"})
    assert result.configs["test.wrong"] == "right"
    assert result.measured["test.wrong"]["seconds"]["fast"] == "wrong result"
    assert result.measured["test.wrong"]["seconds"]["right"] > 0
    tuning.forget()
    assert tuning.choice(backend, "test.wrong") == "right"  # read back from the file


def test_tune_measures_the_product_lanes_and_crossovers_and_info_shows_them(tuning_cache, gpu_device):
    env = {**os.environ, tuning.CACHE_ENV: str(tuning_cache)}
    proc = subprocess.run([sys.executable, "-m", "pxvm", "tune", "--backend", "webgpu",
                           "--quick", "--only", "matmul_quant.webgpu.lanes"],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "matmul_quant.webgpu.lanes" in proc.stdout and "GPU from" in proc.stdout
    info = subprocess.run([sys.executable, "-m", "pxvm", "info", "--json"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert info.returncode == 0, info.stderr
    webgpu = next(t for t in json.loads(info.stdout)["tuning"] if t["backend"] == "webgpu")
    assert webgpu["tuned"] and webgpu["configs"]["matmul_quant.webgpu.lanes"] in (
        1, 4, 8, 16, 32, 64, 128)
    assert set(webgpu["crossovers"]) == set(tuner.CROSSOVER_OPS)


@pytest.mark.parametrize("args,message", [
    (["--only", "nope"], "no tunable nope"),
    (["--backend", "cpu"], "tunes a GPU backend"),
])
def test_tune_refuses_bad_flags_clearly(args, message, tuning_cache):
    proc = subprocess.run([sys.executable, "-m", "pxvm", "tune", *args], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode != 0 and message in proc.stderr


def test_tune_lists_its_tunables():
    proc = subprocess.run([sys.executable, "-m", "pxvm", "tune", "--list"], capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0 and "matmul_quant.webgpu.lanes" in proc.stdout
    # decoding's lanes are not tuned: product by product they chose slower ones
    assert "matmul_quant.lanes.decode" not in proc.stdout
