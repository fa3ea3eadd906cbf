"""Capturing dispatches once and submitting them again (DispatchList), and Graph over it."""

from __future__ import annotations

import gc

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


# ---- a captured list against a normal submit ---------------------------------------

def _chain(b: Batch, x, gain, w, res):
    """A transformer-like chain over GPU tensors: norm + product, residual, join."""
    h = b.rmsnorm_matmul_quant(x, gain, w, qtype=0, k=96, eps=1e-5)
    y = b.matmul_quant_add(x, w, res, qtype=0, k=96)
    return b.softmax(b.concat_columns(h, y))


def _chain_inputs(gpu, rng):
    x = rng.standard_normal((3, 96)).astype(np.float32)
    w = (rng.standard_normal((37, 96)) * 0.1).astype(np.float32).view(np.uint8)  # F32 rows
    return [gpu.from_numpy(a) for a in (x, (1 + 0.3 * rng.standard_normal(96)).astype(np.float32),
                                        w, rng.standard_normal((3, 37)).astype(np.float32))]


def test_captured_list_submitted_many_times_equals_a_normal_submit(rng, gpu_device):
    gpu = pxvm.backends.get_backend("gpu")
    inputs = _chain_inputs(gpu, rng)
    normal = Batch(gpu)
    expected_t = _chain(normal, *inputs)
    normal.execute()
    expected = normal.read(expected_t)
    assert expected.shape == (3, 74) and np.isfinite(expected).all()
    b = Batch(gpu, capture=True)
    out = _chain(b, *inputs)
    captured = b.capture()
    for _ in range(4):
        rec = captured.submit([out.storage])
        assert rec.submitted and len(rec.staged) == 1
        got = rec.staged[0].result(np.float32, out.size).reshape(out.shape)
        np.testing.assert_array_equal(got, expected)


def test_captured_list_counts_its_dispatches(rng, gpu_device):
    gpu = pxvm.backends.get_backend("gpu")
    x = gpu.from_numpy(rng.standard_normal(37).astype(np.float32))
    ctx = gpu.context(capture=True)
    y = x
    for factor in (2.0, 3.0, 0.5, -1.0, 7.0):
        y = pxvm.ops.scale.gpu(ctx, y, factor=factor)
    assert ctx.recorder.dispatches == 5
    captured = ctx.recorder.capture()
    assert len(captured) == 5
    rec = captured.submit([y.storage])
    assert rec.dispatches == 5
    expected = x.numpy()
    for factor in (2.0, 3.0, 0.5, -1.0, 7.0):
        expected = expected * np.float32(factor)
    np.testing.assert_array_equal(rec.staged[0].result(np.float32, 37), expected)


# ---- host writes between submits ---------------------------------------------------

def test_host_writes_between_submits_are_seen_by_the_next_submit_only(rng, gpu_device):
    gpu = pxvm.backends.get_backend("gpu")
    a_vals = rng.standard_normal(37).astype(np.float32)
    b_vals = rng.standard_normal(37).astype(np.float32)
    a, c = gpu.from_numpy(a_vals), gpu.from_numpy(b_vals)
    batch = Batch(gpu, capture=True)
    out = batch.scale(batch.add(a, c), 2.0)
    captured = batch.capture()
    pending, expected = [], []
    for step in range(4):
        pending.append(captured.submit([out.storage, a.storage]).staged)
        expected.append(((a_vals + b_vals) * np.float32(2.0), a_vals.copy()))
        # written after that submit and before the next: only the next one may see it
        a_vals = rng.standard_normal(37).astype(np.float32)
        a.write(a_vals)                                        # Tensor.write
        part = rng.standard_normal(4).astype(np.float32)
        gpu_device.write(c.storage, part, offset=4 * (5 + step))  # Device.write, 4 values
        b_vals[5 + step: 9 + step] = part
    for staged, (exp_out, exp_a) in zip(pending, expected):  # read only after all submits
        np.testing.assert_array_equal(staged[0].result(np.float32, 37), exp_out)
        np.testing.assert_array_equal(staged[1].result(np.float32, 37), exp_a)


def test_tensor_write_replaces_values_in_place_on_both_backends(rng, request):
    request.getfixturevalue("gpu_device")
    for backend in ("cpu", "gpu"):
        t = pxvm.backends.get_backend(backend).from_numpy(np.zeros((3, 5), np.int32) + 9)
        storage = t.storage
        values = rng.integers(-100, 100, (15,)).astype(np.int32)
        t.write(values)   # any shape with the same element count
        assert t.storage is storage
        np.testing.assert_array_equal(t.numpy(), values.reshape(3, 5))
        with pytest.raises(pxvm.runtime.ShapeError,
                           match=r"cannot write 14 values into a tensor of shape \(3, 5\)"):
            t.write(values[:14])


@pytest.mark.parametrize("nbytes,offset", [(8, 2), (6, 0), (16, 140), (160, 0), (7, 140)])
def test_device_write_refuses_unaligned_or_overflowing_writes(nbytes, offset, gpu_device):
    alloc = gpu_device.alloc(148)   # 37 floats
    with pytest.raises(ValueError, match=f"cannot write {nbytes} bytes at offset {offset} "
                                         "into an allocation of 148 bytes"):
        gpu_device.write(alloc, np.zeros(nbytes, np.uint8), offset)


def test_device_write_at_an_offset_changes_only_those_bytes(rng, gpu_device):
    values = rng.standard_normal(37).astype(np.float32)
    alloc = gpu_device.upload(values)
    part = rng.standard_normal(3).astype(np.float32)
    gpu_device.write(alloc, part, offset=4 * 34)   # the last three floats
    values[34:] = part
    np.testing.assert_array_equal(gpu_device.read(alloc, np.float32, 37), values)



@pytest.mark.parametrize("dtype,count", [(np.uint8, 37), (np.float16, 5), (np.uint8, 3)])
def test_tensor_write_of_a_length_not_a_multiple_of_four_bytes(dtype, count, rng, request):
    request.getfixturevalue("gpu_device")
    values = rng.integers(-100, 100, count).astype(dtype)
    for backend in ("cpu", "gpu"):
        t = pxvm.backends.get_backend(backend).from_numpy(np.ones(count, dtype))
        t.write(values)
        np.testing.assert_array_equal(t.numpy(), values)


def test_device_write_of_odd_length_that_ends_the_allocation(rng, gpu_device):
    values = rng.integers(0, 255, 37).astype(np.uint8)
    alloc = gpu_device.upload(values)
    tail = rng.integers(0, 255, 33).astype(np.uint8)
    gpu_device.write(alloc, tail, offset=4)   # bytes 4..36, the last word padded
    values[4:] = tail
    np.testing.assert_array_equal(gpu_device.read(alloc, np.uint8, 37), values)

# ---- what a capturing recorder refuses ---------------------------------------------

def test_capture_needs_a_capturing_recorder_and_happens_once(gpu_device):
    with pytest.raises(RuntimeError, match="capture=True"):
        gpu_device.recorder().capture()
    rec = gpu_device.recorder(capture=True)
    rec.capture()
    with pytest.raises(RuntimeError, match="already captured"):
        rec.capture()


def test_capturing_batch_cannot_execute(rng, gpu_device):
    b = Batch(pxvm.backends.get_backend("gpu"), capture=True)
    b.relu(rng.standard_normal(5).astype(np.float32))
    with pytest.raises(RuntimeError, match="records dispatches only"):
        b.execute()


# ---- captured parameters and buffers outlive everything around them ----------------

def test_captured_parameter_blocks_survive_other_lists_and_normal_recorders(rng, gpu_device):
    gpu = pxvm.backends.get_backend("gpu")
    x_vals = rng.standard_normal(37).astype(np.float32)
    x = gpu.from_numpy(x_vals)
    lists = []
    for factor, shift in ((3.0, 0.25), (-0.5, 4.0)):
        b = Batch(gpu, capture=True)
        out = b.add(b.scale(x, factor), np.full(37, shift, np.float32))
        lists.append((b.capture(), out, (x_vals * np.float32(factor)) + np.float32(shift)))
    for round_ in range(3):
        for captured, out, expected in (lists if round_ % 2 == 0 else lists[::-1]):
            # A normal batch of 300 parameterised dispatches rewrites the device's shared
            # parameter arenas 0 and 1 before every submit of a captured list.
            normal = Batch(gpu)
            y = x
            for i in range(300):
                y = normal.scale(y, 1.0 + i * 1e-3)
            normal.execute()
            got = captured.submit([out.storage]).staged[0].result(np.float32, 37)
            np.testing.assert_array_equal(got, expected)
            assert np.isfinite(normal.read(y)).all()


def test_captured_list_longer_than_one_parameter_arena(rng, gpu_device):
    # 300 dispatches of 256-byte parameter blocks need two 64 KiB arenas of the list's own.
    gpu = pxvm.backends.get_backend("gpu")
    x_vals = rng.standard_normal(37).astype(np.float32)
    factors = 1.0 + 0.01 * rng.standard_normal(300)
    b = Batch(gpu, capture=True)
    y = gpu.from_numpy(x_vals)
    for f in factors:
        y = b.scale(y, float(f))
    captured = b.capture()
    assert len(captured) == 300
    expected = x_vals
    for f in factors:
        expected = expected * np.float32(f)
    for _ in range(2):
        pxvm.ops.scale(x_vals, 9.0, backend="gpu").numpy()  # a normal submit in between
        np.testing.assert_array_equal(
            captured.submit([y.storage]).staged[0].result(np.float32, 37), expected)


def test_captured_list_keeps_buffers_nobody_else_holds(rng, gpu_device):
    # Inputs handed to a capturing batch as numpy arrays are uploaded into buffers only
    # the list holds; were they given back to the pool, the poisoned (and then randomly
    # written) allocations below would take them over.
    gpu = pxvm.backends.get_backend("gpu")
    a_vals = rng.standard_normal(300).astype(np.float32)
    b_vals = rng.standard_normal(300).astype(np.float32)

    def build():
        b = Batch(gpu, capture=True)
        out = b.mul(b.relu(a_vals), b_vals)
        return b.capture(), out

    captured, out = build()
    gc.collect()
    squatters = [gpu_device.alloc(a_vals.nbytes) for _ in range(32)]
    for s in squatters:
        gpu_device.write(s, rng.standard_normal(300).astype(np.float32))
    expected = np.maximum(a_vals, 0) * b_vals
    for _ in range(2):
        np.testing.assert_array_equal(
            captured.submit([out.storage]).staged[0].result(np.float32, 300), expected)


def test_list_submits_queued_before_reading_see_each_others_writes(rng, gpu_device):
    # greedy_step updates its state in place: four submits queued before any read each
    # read the state the previous one left.
    gpu = pxvm.backends.get_backend("gpu")
    logits = rng.standard_normal(1000).astype(np.float32)
    state = gpu.from_numpy(np.array([0, 20], np.int32))
    b = Batch(gpu, capture=True)
    b.greedy_step(logits, state)
    captured = b.capture()
    staged = [captured.submit([state.storage]).staged[0] for _ in range(4)]
    assert [s.result(np.int32).tolist() for s in staged] == \
        [[int(np.argmax(logits)), p] for p in (21, 22, 23, 24)]


def test_list_submit_with_timestamps_reports_gpu_time(rng, gpu_device):
    gpu = pxvm.backends.get_backend("gpu")
    b = Batch(gpu, capture=True)
    b.relu(rng.standard_normal(4096).astype(np.float32))
    rec = b.capture().submit([], timestamps=True)
    if gpu_device.has("timestamp-query"):
        assert rec.gpu_seconds is not None and 0 <= rec.gpu_seconds < 10
    else:
        assert rec.gpu_seconds is None
