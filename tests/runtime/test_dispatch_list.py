"""Capturing dispatches once and submitting them again (DispatchList), and Graph over it."""

from __future__ import annotations

import numpy as np
import pytest

import pxvm
from pxvm.batch import Batch, Graph


def _scaled_copy(b: Batch, src, factor):
    return b.scale(src, factor)


def test_captured_list_rereads_its_inputs_on_every_submit(rng, gpu_device):
    gpu = pxvm.backends.get_backend("gpu")
    src = gpu.from_numpy(rng.standard_normal(37).astype(np.float32))
    b = Batch(gpu, capture=True)
    out = b.relu(_scaled_copy(b, src, 3.0))
    captured = b.capture()
    assert len(captured) == 2
    for _ in range(3):
        values = rng.standard_normal(37).astype(np.float32)
        src.write(values)
        # a normal recorder in between reuses the device's shared parameter slots
        pxvm.ops.scale(rng.standard_normal(5).astype(np.float32), 0.5, backend="gpu").numpy()
        rec = captured.submit([out.storage])
        got = rec.staged[0].result(np.float32, 37)
        np.testing.assert_allclose(got, np.maximum(values * 3.0, 0), rtol=1e-6)


def test_capturing_recorder_records_dispatches_only(gpu_device):
    rec = gpu_device.recorder(capture=True)
    alloc = gpu_device.alloc(16)
    with pytest.raises(RuntimeError, match="readbacks"):
        rec.stage(alloc)
    with pytest.raises(RuntimeError, match="copies"):
        rec.copy(alloc, gpu_device.alloc(16))
    with pytest.raises(RuntimeError, match="capture"):
        rec.submit()


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_graph_launches_run_in_order_and_update_state(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    be = pxvm.backends.get_backend(backend)
    logits = be.from_numpy(rng.standard_normal((4, 50)).astype(np.float32))
    state = be.from_numpy(np.array([0, 10], np.int32))
    expected = np.argmax(logits.numpy(), axis=1)

    def record(b):
        row = b.slice_rows(logits.reshape(4, 50), 0, 4)
        b.greedy_step(row, state)
        return {"state": state, "row": row}

    graph = Graph(be, record)
    assert (graph.dispatches is None) == (backend == "cpu")
    launches = [graph.launch("state") for _ in range(3)]   # all submitted before reading
    positions = [launch.result()["state"][1] for launch in launches]
    assert positions == [11, 12, 13]
    assert launches[-1].result()["state"][0] == int(np.argmax(logits.numpy()))
    assert np.array_equal(np.argmax(graph.run("row")["row"], axis=1), expected)
