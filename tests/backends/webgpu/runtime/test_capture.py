"""Capturing dispatches once (CapturingRecorder) and submitting them again and again
(DispatchList): inputs re-read on every submit, host writes in between, parameter blocks
and buffers that outlive everything around them."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import pxvm
from pxvm.backends.webgpu import webgpu_backend
from pxvm.batch import Batch
from pxvm.ops import decoding, transformer
from pxvm.backends.webgpu.runtime import CapturingRecorder, DispatchList, Recorder


def _captured(record) -> tuple[DispatchList, object]:
    """The DispatchList of what `record()` records in a capturing batch, and its result."""
    batch = Batch(webgpu_backend(), capture=True)
    with batch:
        out = record()
    return batch.capture().dispatches, out


def test_captured_list_rereads_its_inputs_on_every_submit(rng, gpu_device):
    src = webgpu_backend().from_numpy(rng.standard_normal(37).astype(np.float32))
    captured, out = _captured(lambda: pxvm.ops.relu(pxvm.ops.scale(src, 3.0)))
    assert isinstance(captured, DispatchList) and len(captured) == 2
    for _ in range(3):
        values = rng.standard_normal(37).astype(np.float32)
        src.write(values)
        # a normal recorder in between reuses the device's shared parameter slots
        pxvm.ops.scale(rng.standard_normal(5).astype(np.float32), 0.5, backend="gpu").numpy()
        rec = captured.submit([out.storage])
        got = rec.staged[0].result(np.float32, 37)
        np.testing.assert_allclose(got, np.maximum(values * 3.0, 0), rtol=1e-6)


def test_capturing_recorder_records_dispatches_only(gpu_device):
    # No readbacks, copies or submits: a captured list is encoded by a normal Recorder.
    rec = gpu_device.recorder(capture=True)
    assert isinstance(rec, CapturingRecorder) and not isinstance(rec, Recorder)
    alloc = gpu_device.alloc(16)
    with pytest.raises(AttributeError):
        rec.stage(alloc)
    with pytest.raises(AttributeError):
        rec.copy(alloc, gpu_device.alloc(16))
    with pytest.raises(AttributeError):
        rec.submit()


# ---- a captured list against a normal submit ---------------------------------------

def _chain(x, gain, w, res):
    """A transformer-like chain over GPU tensors: norm + product, residual, join."""
    h = transformer.rmsnorm_matmul_quant(x, gain, w, qtype="F32", k=96, eps=1e-5)
    y = transformer.matmul_quant_add(x, w, res, qtype="F32", k=96)
    return pxvm.ops.softmax(pxvm.ops.concat_columns(h, y))


def _chain_inputs(gpu, rng):
    x = rng.standard_normal((3, 96)).astype(np.float32)
    w = (rng.standard_normal((37, 96)) * 0.1).astype(np.float32).view(np.uint8)  # F32 rows
    return [gpu.from_numpy(a) for a in (x, (1 + 0.3 * rng.standard_normal(96)).astype(np.float32),
                                        w, rng.standard_normal((3, 37)).astype(np.float32))]


def test_captured_list_submitted_many_times_equals_a_normal_submit(rng, gpu_device):
    gpu = webgpu_backend()
    inputs = _chain_inputs(gpu, rng)
    with Batch(gpu) as normal:
        expected_t = _chain(*inputs)
    normal.execute()
    expected = normal.read(expected_t)
    assert expected.shape == (3, 74) and np.isfinite(expected).all()
    captured, out = _captured(lambda: _chain(*inputs))
    for _ in range(4):
        rec = captured.submit([out.storage])
        assert rec.submitted and len(rec.staged) == 1
        got = rec.staged[0].result(np.float32, out.size).reshape(out.shape)
        np.testing.assert_array_equal(got, expected)


def test_captured_list_counts_its_dispatches(rng, gpu_device):
    gpu = webgpu_backend()
    x = gpu.from_numpy(rng.standard_normal(37).astype(np.float32))
    ctx = gpu.context(capture=True)
    y = x
    for factor in (2.0, 3.0, 0.5, -1.0, 7.0):
        y = pxvm.ops.scale.kernels["webgpu"](ctx, y, factor=factor)
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
    gpu = webgpu_backend()
    a_vals = rng.standard_normal(37).astype(np.float32)
    b_vals = rng.standard_normal(37).astype(np.float32)
    a, c = gpu.from_numpy(a_vals), gpu.from_numpy(b_vals)
    captured, out = _captured(lambda: pxvm.ops.scale(pxvm.ops.add(a, c), 2.0))
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


# ---- what a capturing recorder refuses ---------------------------------------------

def test_capture_needs_a_capturing_recorder_and_happens_once(gpu_device):
    with pytest.raises(AttributeError):
        gpu_device.recorder().capture()
    rec = gpu_device.recorder(capture=True)
    rec.capture()
    with pytest.raises(RuntimeError, match="already captured"):
        rec.capture()


@pytest.mark.parametrize("runs", [0, -1])
def test_list_submit_with_runs_below_one_is_refused(runs, rng, gpu_device):
    captured, out = _captured(lambda: pxvm.ops.relu(rng.standard_normal(5).astype(np.float32)))
    with pytest.raises(ValueError, match="runs must be >= 1"):
        captured.submit([out.storage], runs=runs)


# ---- captured parameters and buffers outlive everything around them ----------------

def test_captured_parameter_blocks_survive_other_lists_and_normal_recorders(rng, gpu_device):
    gpu = webgpu_backend()
    x_vals = rng.standard_normal(37).astype(np.float32)
    x = gpu.from_numpy(x_vals)
    lists = []
    for factor, shift in ((3.0, 0.25), (-0.5, 4.0)):
        captured, out = _captured(lambda: pxvm.ops.add(pxvm.ops.scale(x, factor),
                                                       np.full(37, shift, np.float32)))
        lists.append((captured, out, (x_vals * np.float32(factor)) + np.float32(shift)))
    for round_ in range(3):
        for captured, out, expected in (lists if round_ % 2 == 0 else lists[::-1]):
            # A normal batch of 300 parameterised dispatches rewrites the device's shared
            # parameter arenas 0 and 1 before every submit of a captured list.
            with Batch(gpu) as normal:
                y = x
                for i in range(300):
                    y = pxvm.ops.scale(y, 1.0 + i * 1e-3)
            normal.execute()
            got = captured.submit([out.storage]).staged[0].result(np.float32, 37)
            np.testing.assert_array_equal(got, expected)
            assert np.isfinite(normal.read(y)).all()


def test_captured_list_longer_than_one_parameter_arena(rng, gpu_device):
    # 300 dispatches of 256-byte parameter blocks need two 64 KiB arenas of the list's own.
    gpu = webgpu_backend()
    x_vals = rng.standard_normal(37).astype(np.float32)
    factors = 1.0 + 0.01 * rng.standard_normal(300)

    def record():
        y = gpu.from_numpy(x_vals)
        for f in factors:
            y = pxvm.ops.scale(y, float(f))
        return y

    captured, y = _captured(record)
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
    a_vals = rng.standard_normal(300).astype(np.float32)
    b_vals = rng.standard_normal(300).astype(np.float32)
    captured, out = _captured(lambda: pxvm.ops.mul(pxvm.ops.relu(a_vals), b_vals))
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
    logits = rng.standard_normal(1000).astype(np.float32)
    state = webgpu_backend().from_numpy(np.array([0, 20], np.int32))
    captured, _ = _captured(lambda: decoding.greedy_step(logits, state))
    staged = [captured.submit([state.storage]).staged[0] for _ in range(4)]
    assert [s.result(np.int32).tolist() for s in staged] == \
        [[int(np.argmax(logits)), p] for p in (21, 22, 23, 24)]


def test_list_submit_with_runs_stages_each_run_or_the_last(rng, gpu_device):
    # runs=3 in one command buffer: three snapshots of the state (each_run), or one of
    # the state after the last run; the next submit goes on from there.
    logits = rng.standard_normal(1000).astype(np.float32)
    state = webgpu_backend().from_numpy(np.array([0, 20], np.int32))
    captured, _ = _captured(lambda: decoding.greedy_step(logits, state))
    token = int(np.argmax(logits))
    every = captured.submit([state.storage], runs=3).staged[0]
    last = captured.submit([state.storage], runs=3, each_run=False).staged[0]
    assert every.result(np.int32).tolist() == [[token, p] for p in (21, 22, 23)]
    assert last.result(np.int32).tolist() == [token, 26]


def test_list_submit_with_timestamps_reports_gpu_time(rng, gpu_device):
    captured, _ = _captured(lambda: pxvm.ops.relu(rng.standard_normal(4096).astype(np.float32)))
    rec = captured.submit([], timestamps=True)
    if gpu_device.has("timestamp-query"):
        assert rec.device_seconds is not None and 0 <= rec.device_seconds < 10
    else:
        assert rec.device_seconds is None
