"""The wgpu calls of the hot path (pxvm.backends.webgpu.runtime.native): a device on the portable
path (wgpu-py's public API) computes what the default device (wgpu-native's C calls
where installed) computes, through every path those calls serve: a Batch's submit and
readbacks, captured lists encoded run after run, Graph launches queued before reading,
and pxVM programs."""

from __future__ import annotations

import os

import numpy as np
import pytest

import pxvm
from pxvm.backends.webgpu import WebGPUBackend, webgpu_backend
from pxvm.batch import Batch, Graph
from pxvm.ops import decoding
from pxvm.backends.webgpu.runtime import Device, NativeCalls, Pipeline, PortableCalls
from pxvm.backends.webgpu.runtime.native import choose_calls
from pxvm.vm import run_program_cpu, run_program_gpu
from pxvm.web.cases import random_program


@pytest.fixture(scope="module")
def portable(gpu_device):
    """A WebGPU backend on a device of its own that uses wgpu-py's public calls only."""
    device = Device(os.environ.get("PXVM_DEVICE"), calls=PortableCalls())
    assert type(device.calls) is PortableCalls and device.name == gpu_device.name
    return WebGPUBackend(device)


@pytest.fixture
def both(portable):
    """(portable backend, default backend)."""
    return portable, webgpu_backend()


def _chain(be, x0, w, gain):
    """A few layers through one Batch; the result and a consumed intermediate."""
    with Batch(be) as batch:
        x = batch.upload(x0)
        for wi in w:
            h = pxvm.ops.matmul(pxvm.ops.rmsnorm(x, gain), wi)
            x = pxvm.ops.add(pxvm.ops.gelu(h), x)
        out = pxvm.ops.softmax(x)
    batch.execute()
    return batch.read(out), batch.read(h)


def test_a_batch_on_the_portable_path_equals_the_default_device(both, rng):
    x0 = rng.standard_normal((9, 48)).astype(np.float32)
    w = [(rng.standard_normal((48, 48)) * 0.2).astype(np.float32) for _ in range(3)]
    gain = (1 + 0.1 * rng.standard_normal(48)).astype(np.float32)
    (p_out, p_h), (d_out, d_h) = (_chain(be, x0, w, gain) for be in both)
    assert np.isfinite(p_out).all() and np.isfinite(p_h).all()
    np.testing.assert_array_equal(p_out, d_out)
    np.testing.assert_array_equal(p_h, d_h)
    ref, _ = _chain("numpy", x0, w, gain)
    np.testing.assert_allclose(p_out, ref, rtol=1e-4, atol=1e-6)


def _accumulator(be, rng_seed):
    """Tensors of a step that adds `inc` to `acc` in place and takes a greedy step."""
    rng = np.random.default_rng(rng_seed)
    acc0 = rng.integers(-50, 50, (4, 8)).astype(np.float32)
    inc = rng.integers(-5, 5, (4, 8)).astype(np.float32)
    logits = rng.standard_normal(300).astype(np.float32)
    t = {"acc": be.from_numpy(acc0), "inc": be.from_numpy(inc),
         "logits": be.from_numpy(logits), "state": be.from_numpy(np.array([0, 7], np.int32))}

    def record():
        pxvm.ops.write_rows(t["acc"], pxvm.ops.add(t["acc"], t["inc"]))
        decoding.greedy_step(t["logits"], t["state"])
        return {"acc": t["acc"], "state": t["state"]}

    return t, record, (acc0, inc, int(np.argmax(logits)))


@pytest.mark.parametrize("each_run", [True, False])
def test_a_captured_list_replayed_with_runs_on_the_portable_path(each_run, both, rng,
                                                                  monkeypatch):
    seed = int(rng.integers(2**31))
    portable = both[0]
    encoded = []
    encode = portable.device.calls.encode
    monkeypatch.setattr(portable.device.calls, "encode",
                        lambda compute_pass, prepared: encoded.append(len(prepared))
                        or encode(compute_pass, prepared))
    results = []
    for be in both:
        t, record, (acc0, inc, token) = _accumulator(be, seed)
        with Batch(be, capture=True) as batch:
            record()
        dispatches = batch.capture().dispatches
        stage = [t["acc"].storage, t["state"].storage]
        submitted = [dispatches.submit(stage, runs=3, each_run=each_run) for _ in range(2)]
        got = [[s.result(dtype, n) for s, dtype, n in zip(rec.staged, (np.float32, np.int32),
                                                           (32, 2))]
               for rec in submitted]
        results.append(got)
    # 2 submits of 3 runs, each run one replay of the list through the calls' encode
    assert encoded == [len(dispatches)] * 6
    for (p_acc, p_state), (d_acc, d_state) in zip(*results):
        np.testing.assert_array_equal(p_acc, d_acc)
        np.testing.assert_array_equal(p_state, d_state)
    runs = [1, 2, 3, 4, 5, 6]
    want_acc = [(acc0 + r * inc).reshape(-1) for r in runs]
    want_state = [[token, 7 + r] for r in runs]
    (first_acc, first_state), (second_acc, second_state) = results[0]
    if each_run:
        np.testing.assert_array_equal(np.concatenate([first_acc, second_acc]), want_acc)
        assert np.concatenate([first_state, second_state]).tolist() == want_state
    else:
        np.testing.assert_array_equal([first_acc, second_acc], [want_acc[2], want_acc[5]])
        assert [first_state.tolist(), second_state.tolist()] == [want_state[2], want_state[5]]


def test_graph_launches_queued_before_reading_on_the_portable_path(both, rng):
    seed = int(rng.integers(2**31))
    results = []
    for be in both:
        _, record, (acc0, inc, token) = _accumulator(be, seed)
        graph = Graph(be, record)
        launches = [graph.launch("acc", "state") for _ in range(4)]   # nothing read yet
        results.append([launch.result() for launch in launches])
    for step, (p, d) in enumerate(zip(*results), start=1):
        np.testing.assert_array_equal(p["acc"], d["acc"])
        np.testing.assert_array_equal(p["acc"], acc0 + step * inc)
        assert p["state"].tolist() == d["state"].tolist() == [token, 7 + step]


@pytest.mark.parametrize("seed", [3, 11])
def test_a_pxvm_program_on_the_portable_path(seed, both):
    img = random_program(seed)
    cpu = run_program_cpu(img)
    for be in both:
        np.testing.assert_array_equal(run_program_gpu(img, be), cpu)


def test_portable_readbacks_wait_without_submission_indices(portable, rng):
    values = rng.standard_normal(1001).astype(np.float32)
    rec = portable.device.recorder()
    staged = rec.stage(portable.device.upload(values))
    rec.submit()
    assert staged.submission is None   # wgpu-py's submit gives no index
    np.testing.assert_array_equal(staged.result(np.float32), values)


# ---- choosing and preparing ----------------------------------------------------------

def test_choose_calls_honours_pxvm_wgpu_calls(monkeypatch):
    for value in ("portable", "Portable"):
        monkeypatch.setenv("PXVM_WGPU_CALLS", value)
        assert type(choose_calls()) is PortableCalls
    monkeypatch.setenv("PXVM_WGPU_CALLS", "native")
    assert type(choose_calls()) is NativeCalls
    monkeypatch.delenv("PXVM_WGPU_CALLS")
    calls = choose_calls()   # wgpu-native is installed here
    assert type(calls) is NativeCalls and calls.name == "wgpu-native"
    assert PortableCalls.name == "wgpu-py"


def _captured_items(be, rng):
    x = be.from_numpy(rng.standard_normal(37).astype(np.float32))
    with Batch(be, capture=True) as batch:
        pxvm.ops.scale(pxvm.ops.relu(x), 2.0)
    return batch.capture().dispatches


def test_native_prepare_turns_items_into_raw_handles(gpu_device, rng):
    dispatches = _captured_items(webgpu_backend(), rng)
    prepared = NativeCalls().prepare(dispatches.items)
    assert len(prepared) == len(dispatches.items) == 2
    for (pipeline, group, groups), raw in zip(dispatches.items, prepared):
        assert isinstance(pipeline, Pipeline)   # what a capture keeps
        assert raw == (pipeline.pipeline._internal, group._internal, *groups)
        assert "cdata" in repr(raw[0]) and "cdata" in repr(raw[1])   # cffi handles
        assert all(type(n) is int for n in raw[2:])
    if isinstance(gpu_device.calls, NativeCalls):
        assert dispatches.prepared == prepared


def test_portable_prepare_leaves_wgpu_py_objects(portable, rng):
    # Only the compiled pipeline is taken out of pxvm's Pipeline; the bind groups and
    # workgroup counts are the captured ones themselves.
    dispatches = _captured_items(portable, rng)
    prepared = PortableCalls().prepare(dispatches.items)
    assert len(prepared) == 2
    for (pipeline, group, groups), item in zip(dispatches.items, prepared):
        assert item[0] is pipeline.pipeline and item[1] is group and item[2] is groups
        assert type(item[0]).__name__ == "GPUComputePipeline"
    assert [tuple(x) for x in dispatches.prepared] == [tuple(x) for x in prepared]
    assert dispatches.items[0][2] == (1, 1, 1)
