"""The fast CPU backend (pxvm.backends.cpu): recording and running in order, references
recorded for ops without a CPU kernel, in-place ops, Graph replays, packed weights
dropped when written, profiles, thread settings, and BLAS held to one thread while its
kernels run."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from importlib import metadata
from pathlib import Path

import numpy as np
import pytest
from threadpoolctl import threadpool_info

import pxvm
from pxvm.backends.cpu import CpuBackend, CpuContext
from pxvm.core import RecordingContext, get_backend
from pxvm.backends.cpu import backend as cpu_module
from pxvm.batch import Batch, Graph
from pxvm.ops.decoding import greedy_step

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "llm"))
from gguf_blocks import dequantize, quantize  # noqa: E402


def test_cpu_backend_records_into_a_cpu_context():
    backend = get_backend("cpu")
    ctx = backend.context()
    assert isinstance(ctx, CpuContext) and isinstance(ctx, RecordingContext)
    assert ctx.backend is backend and backend.host_arrays and backend.records
    assert backend.compiles_on_first_use
    assert backend.describe().startswith("CPU: numba ")


def test_ops_in_a_batch_run_at_execute_in_the_order_recorded(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    with Batch("cpu") as batch:
        y = pxvm.ops.relu(x)                 # no CPU kernel: its reference is recorded
        z = pxvm.ops.mul(y, y)
        assert np.isnan(y.storage).all()     # recorded, not run (outputs start poisoned)
    batch.execute()
    np.testing.assert_array_equal(batch.read(z), np.maximum(x, 0) ** 2)


@pytest.mark.parametrize("kind", ["capture", "timestamps", "profile"])
def test_flush_leaves_capturing_timed_and_profiled_batches_one_submit(kind, rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    batch = Batch("cpu", **{kind: True})
    with batch:
        y = pxvm.ops.mul(x, x)
        batch.flush()
        assert np.isnan(y.storage).all()     # still recorded, not run
        z = pxvm.ops.mul(y, y)
    if kind == "capture":
        captured = batch.capture()
        assert len(captured) == 2
        captured.encode([z]).submit()
    else:
        batch.execute()
    np.testing.assert_array_equal(z.storage, (x * x) * (x * x))


def test_flush_runs_what_a_plain_batch_recorded_so_far(rng):
    x = rng.standard_normal((4, 6)).astype(np.float32)
    with Batch("cpu") as batch:
        y = pxvm.ops.mul(x, x)
        batch.flush()
        np.testing.assert_array_equal(y.storage, x * x)
    batch.execute()


def test_in_place_ops_return_their_own_tensor():
    state = pxvm.tensor(np.array([0, 3, 0, 0], np.int32), backend="cpu")
    logits = pxvm.tensor(np.array([0.5, 2.0, -1.0], np.float32), backend="cpu")
    assert greedy_step(logits, state) is state
    np.testing.assert_array_equal(state.numpy(), [1, 4, 0, 1])


def test_a_graph_replays_its_calls_reading_the_state_each_run():
    backend = get_backend("cpu")
    state = backend.from_numpy(np.array([0, 0, 0, 0, 0, 0], np.int32))
    logits = backend.from_numpy(np.array([1.0, 0.0, 3.0], np.float32))

    def record():
        greedy_step(logits, state)
        return {"state": state}

    graph = Graph(backend, record)
    assert graph.dispatches == 1
    assert graph.run("state")["state"][:2].tolist() == [2, 1]
    launch = graph.launch("state", runs=3)
    np.testing.assert_array_equal(launch.result()["state"][:, 1], [2, 3, 4])
    last = graph.launch("state", runs=2, each_run=False).result()["state"]
    assert last.shape == (6,) and last[1] == 6


def test_writing_a_weight_drops_its_packed_form(rng):
    k = 64
    first, second = (quantize(rng.standard_normal((5, k)).astype(np.float32), "Q4_1") for _ in "ab")
    x = rng.standard_normal((1, k)).astype(np.float32)
    w = pxvm.tensor(first, backend="cpu")
    # decoding rounds x to int16 steps (backends/cpu/kernels/quantized.py): each output
    # within a step times sum |w|, far below how much the two weights' products differ
    values = [dequantize(q, "Q4_1", k) for q in (first, second)]
    atol = np.abs(x).max() / 32767 * max(np.abs(v).sum(1).max() for v in values)
    before = pxvm.ops.matmul_quant(x, w, qtype="Q4_1", k=k).numpy()
    np.testing.assert_allclose(before, x @ values[0].T, rtol=1e-6, atol=atol)
    w.write(second)
    after = pxvm.ops.matmul_quant(x, w, qtype="Q4_1", k=k).numpy()
    np.testing.assert_allclose(after, x @ values[1].T, rtol=1e-6, atol=atol)
    assert np.abs(before - after).max() > 100 * atol


def test_profiled_and_timed_batches_report_their_calls(rng):
    x = rng.standard_normal((2, 8)).astype(np.float32)
    with Batch("cpu", profile=True) as batch:
        pxvm.ops.rmsnorm(x, np.ones(8, np.float32))
    batch.execute()
    assert [label for label, _ in batch.profile] == ["rmsnorm", "readback"]
    assert all(seconds >= 0 for _, seconds in batch.profile)
    with Batch("cpu", timestamps=True) as timed:
        pxvm.ops.relu(x)
    timed.execute()
    assert timed.device_seconds is not None and timed.device_seconds >= 0


def test_numpys_blas_runs_on_one_thread_while_the_kernels_run():
    seen = []
    ctx = get_backend("cpu").context()
    ctx.record_host("probe", lambda: seen.extend(
        i["num_threads"] for i in threadpool_info()
        if i["user_api"] == "blas" and "numpy" in i["filepath"]))
    ctx.submit()
    assert seen and set(seen) == {1}


@pytest.mark.parametrize("value,threads", [("3", 3), (" 1 ", 1)])
def test_thread_count_follows_the_environment(value, threads, monkeypatch):
    monkeypatch.setenv("PXVM_CPU_THREADS", value)
    assert cpu_module.cpu_threads() == threads


@pytest.mark.parametrize("value", ["0", "-2", "many"])
def test_a_bad_thread_count_is_a_clear_error(value, monkeypatch):
    monkeypatch.setenv("PXVM_CPU_THREADS", value)
    with pytest.raises(ValueError, match="PXVM_CPU_THREADS must be a positive integer"):
        cpu_module.cpu_threads()


def test_default_thread_count_is_the_cores_this_process_may_use(monkeypatch):
    monkeypatch.delenv("PXVM_CPU_THREADS", raising=False)
    import os
    assert cpu_module.cpu_threads() == len(os.sched_getaffinity(0))


@pytest.mark.parametrize("src,dst", [("numpy", "cpu"), ("cpu", "numpy"), ("cpu", "cpu")])
def test_tensors_copy_between_the_cpu_backends(src, dst, rng):
    values = rng.standard_normal((3, 5)).astype(np.float32)
    original = pxvm.tensor(values, backend=src)
    copy = pxvm.tensor(original, backend=dst)
    assert copy.backend is get_backend(dst) and copy.storage is not original.storage
    copy.write(np.zeros(15, np.float32))
    np.testing.assert_array_equal(original.numpy(), values)


def test_a_backend_object_of_its_own_keeps_its_own_packed_weights(rng):
    mine = CpuBackend()
    raw = quantize(rng.standard_normal((3, 32)).astype(np.float32), "Q4_1")
    x = rng.standard_normal((1, 32)).astype(np.float32)
    got = pxvm.ops.matmul_quant(x, raw, qtype="Q4_1", k=32, backend=mine)
    assert got.backend is mine
    w = dequantize(raw, "Q4_1", 32)
    atol = np.abs(x).max() / 32767 * np.abs(w).sum(1).max()  # x's int16 step times sum |w|
    np.testing.assert_allclose(got.numpy(), x @ w.T, rtol=1e-6, atol=atol)


def _run_parallel_kernel(prelude: str = "") -> dict:
    """A fresh process (the thread pool is chosen once per process) that runs a CPU
    kernel and prints the backend's details."""
    code = (prelude + "import json, numpy as np, pxvm\n"
            "from pxvm.backends.cpu import backend\n"
            "from gguf import GGMLQuantizationType, quants\n"
            "w = quants.quantize(np.random.rand(64, 256).astype(np.float32),\n"
            "                    GGMLQuantizationType.Q8_0)\n"
            "x = np.random.rand(1, 256).astype(np.float32)\n"
            "pxvm.ops.matmul_quant(x, w, qtype='Q8_0', k=256, backend='cpu').numpy()\n"
            "print(json.dumps(pxvm.get_backend('cpu').details()))\n")
    env = {k: v for k, v in os.environ.items() if k != "NUMBA_THREADING_LAYER"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=env, timeout=300, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.skipif(importlib.util.find_spec("numba") is None, reason="needs numba")
def test_kernels_run_on_tbb_from_a_plain_pip_install():
    # the tbb wheel's library lies outside the loader's path in a venv; the backend
    # loads it itself, so numba's TBB pool runs and nothing is reported missing
    try:
        metadata.distribution("tbb")
    except metadata.PackageNotFoundError:
        pytest.skip("the tbb package is not installed here")
    details = _run_parallel_kernel()
    assert details["thread_pool"] == "tbb"
    assert details["thread_pool_warning"] is None


def test_a_tbb_that_cannot_load_is_reported_with_the_pool_used_instead(monkeypatch):
    # (loading itself cannot be made to fail here: this Python's own library path may
    # hold libtbb; a fresh venv's does not, which is what the backend's loader is for)
    monkeypatch.delenv("NUMBA_THREADING_LAYER", raising=False)
    monkeypatch.setattr(cpu_module, "_tbb_problem", "libtbb.so.12 did not load: gone")
    warning = cpu_module._thread_pool_warning("omp")
    assert "TBB could not be loaded (libtbb.so.12 did not load: gone)" in warning
    assert "run on omp" in warning and "PXVM_CPU_THREADS=1" in warning
    assert cpu_module._thread_pool_warning("tbb") is None
    monkeypatch.setenv("NUMBA_THREADING_LAYER", "omp")   # the user's own choice
    assert cpu_module._thread_pool_warning("omp") is None
