"""pxvm.batch on both backends. Batch: ops called inside `with batch:` are recorded into
one submit (on numpy they run as called), results nobody consumed come back with it,
flush() submits early, and using a batch out of order is a BatchStateError. Graph: a
chain recorded once and launched again and again (a decoding step).

The Graph's chain is a toy decoder whose state never leaves the device: the current
token (state[0]) and the position (state[1]) pick rows of an embedding table that sum to
the new qkv, attention_cached appends to the KV cache at that position, a normed product
gives logits and greedy_step writes the next token and advances the position. On the
numpy backend the same chain simply runs again per launch, the reference for the GPU's
replays."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, assert_close

import pxvm
from pxvm.backends.webgpu import CapturedDispatches
from pxvm.batch import Batch, BatchStateError, Graph
from pxvm.ops import decoding, transformer
from pxvm.backends.webgpu.runtime import DispatchList

HQ, HKV, D, N_CTX, VOCAB = 2, 1, 8, 48, 64
QKV = (HQ + 2 * HKV) * D
BACKENDS = ["numpy", "webgpu"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    if request.param == "webgpu":
        request.getfixturevalue("gpu_device")
    return request.param


def _count_submits(monkeypatch, device) -> list:
    submits = []
    submit = device.submit
    monkeypatch.setattr(device, "submit", lambda buffer: submits.append(buffer) or submit(buffer))
    return submits


# ---- Batch: recording inside `with` ------------------------------------------------

def test_ops_inside_with_record_into_the_batch_and_outside_run_at_once(rng, gpu_device,
                                                                       monkeypatch):
    submits = _count_submits(monkeypatch, gpu_device)
    x = rng.standard_normal(37).astype(np.float32)
    batch = Batch("webgpu")
    with batch:
        y = pxvm.ops.relu(x)     # a numpy input is uploaded to the batch's backend
    assert not submits
    outside = pxvm.ops.scale(x, 2.0, backend="webgpu")   # not in a `with`: runs now
    assert len(submits) == 1
    np.testing.assert_array_equal(outside.numpy(), x * 2)
    batch.execute()
    np.testing.assert_array_equal(batch.read(y), np.maximum(x, 0))


def test_numpy_batch_runs_ops_as_they_are_called(rng):
    x = rng.standard_normal(9).astype(np.float32)
    with Batch("numpy") as batch:
        y = pxvm.ops.scale(x, 3.0)
        assert batch.context is None
        np.testing.assert_array_equal(y.numpy(), x * np.float32(3.0))   # already there
    batch.execute()
    np.testing.assert_array_equal(batch.read(y), x * np.float32(3.0))


def test_ops_record_into_the_innermost_batch(backend, rng):
    x = rng.standard_normal(9).astype(np.float32)
    outer, inner = Batch(backend), Batch(backend)
    with outer:
        a = pxvm.ops.scale(x, 2.0)
        with inner:
            b = pxvm.ops.relu(x)
        c = pxvm.ops.add(a, a)   # back in the outer batch
    inner.execute()
    np.testing.assert_array_equal(inner.read(b), np.maximum(x, 0))
    with pytest.raises(BatchStateError):
        outer.read(c)            # inner's execute did not run the outer batch
    outer.execute()
    np.testing.assert_array_equal(outer.read(c), x * 4)


def test_op_asking_for_another_backend_inside_a_batch_is_refused(backend, rng, gpu_device):
    other = "webgpu" if backend == "numpy" else "numpy"
    x = rng.standard_normal(5).astype(np.float32)
    with Batch(backend) as batch:
        with pytest.raises(pxvm.PxvmError,
                           match=f"on {backend} ops run there; leave backend='auto'"):
            pxvm.ops.relu(x, backend=other)
        y = pxvm.ops.relu(x, backend=backend)   # its own backend is fine
        # a tensor of the other backend is copied into the batch's
        z = pxvm.ops.add(y, pxvm.tensor(x, backend=other))
    batch.execute()
    assert z.backend is batch.backend
    np.testing.assert_array_equal(batch.read(z), np.maximum(x, 0) + x)


# ---- Batch: one submit, results staged with it -------------------------------------

def test_unconsumed_results_come_back_with_the_one_submit(rng, gpu_device, monkeypatch):
    submits = _count_submits(monkeypatch, gpu_device)
    x = rng.standard_normal((4, 33)).astype(np.float32)
    dst = pxvm.tensor(np.zeros((6, 33), np.float32), backend="webgpu")
    with Batch("webgpu") as batch:
        t = batch.upload(x)
        hidden = pxvm.ops.relu(t)               # consumed below: not staged
        a = pxvm.ops.scale(hidden, 2.0)
        b = pxvm.ops.sigmoid(hidden)
        written = pxvm.ops.write_rows(dst, t, start=1)   # in place: no result of its own
    assert written is dst
    batch.execute()
    assert len(submits) == 1
    np.testing.assert_array_equal(batch.read(a), np.maximum(x, 0) * 2)
    np.testing.assert_allclose(batch.read(b), 1 / (1 + np.exp(-np.maximum(x, 0))), rtol=1e-6)
    assert len(submits) == 1   # both read from the execute's own readbacks
    np.testing.assert_array_equal(batch.read(hidden), np.maximum(x, 0))
    np.testing.assert_array_equal(batch.read(dst)[1:5], x)
    assert len(submits) == 3   # consumed tensors are read back on demand
    np.testing.assert_array_equal(batch.read(a), np.maximum(x, 0) * 2)   # again: same values


def test_execute_async_and_read_async(backend, rng):
    x = rng.standard_normal(33).astype(np.float32)

    async def main():
        with Batch(backend) as batch:
            y = pxvm.ops.scale(batch.upload(x), 2.0)
            z = pxvm.ops.relu(y)
        assert await batch.execute_async() is batch
        return await batch.read_async(y), await batch.read_async(z)

    y, z = asyncio.run(main())
    np.testing.assert_array_equal(y, x * 2)
    np.testing.assert_array_equal(z, np.maximum(x * 2, 0))


def test_flushed_batches_give_what_one_submit_gives(backend, rng):
    # Layers of a chain submitted as they are queued (each reads the last one's output,
    # buffers freed in between are reused) against the same chain in one submit.
    x0 = rng.standard_normal((37, 29)).astype(np.float32)
    w = [rng.standard_normal((29, 29)).astype(np.float32) * 0.3 for _ in range(6)]

    def run(flush: bool):
        with Batch(backend) as b:
            x = b.upload(x0)
            for wi in w:
                x = pxvm.ops.gelu(pxvm.ops.add(pxvm.ops.matmul(x, wi), x))
                if flush:
                    assert b.flush() is b
        b.execute()
        return b.read(x)

    expected = x0
    for wi in w:
        expected = pxvm.ops.gelu.reference(expected @ wi + expected)
    assert_close(run(True), expected, NMSE_ELEMENTWISE)
    np.testing.assert_array_equal(run(True), run(False))


def test_flush_submits_what_is_recorded_so_far(rng, gpu_device, monkeypatch):
    submits = _count_submits(monkeypatch, gpu_device)
    with Batch("webgpu") as b:
        y = pxvm.ops.relu(rng.standard_normal(100).astype(np.float32))
        b.flush()
        assert len(submits) == 1
        z = pxvm.ops.scale(y, 2.0)
    b.execute()
    assert len(submits) == 2
    np.testing.assert_array_equal(b.read(z), y.numpy() * 2)


# ---- Batch: out of order -----------------------------------------------------------

def test_reading_before_execute_is_an_error(backend):
    with Batch(backend) as batch:
        y = pxvm.ops.relu(batch.upload([1.0, -1.0]))
    with pytest.raises(BatchStateError, match=r"read\(\) before execute"):
        batch.read(y)
    with pytest.raises(BatchStateError, match=r"read_async\(\) before execute"):
        asyncio.run(batch.read_async(y))


def test_an_executed_batch_records_nothing_more(backend):
    with Batch(backend) as batch:
        pxvm.ops.relu(batch.upload([1.0, -1.0]))
    batch.execute()
    for misuse in (lambda: batch.execute(), lambda: batch.upload([1.0]), lambda: batch.flush(),
                   lambda: batch.__enter__()):
        with pytest.raises(BatchStateError, match="already executed; start a new Batch"):
            misuse()


def test_capture_needs_a_capturing_batch_and_a_capturing_batch_cannot_execute(backend, rng):
    with Batch(backend) as plain:
        pxvm.ops.relu(rng.standard_normal(5).astype(np.float32))
    with pytest.raises(BatchStateError, match="capture=True"):
        plain.capture()
    with Batch(backend, capture=True) as capturing:
        pxvm.ops.relu(rng.standard_normal(5).astype(np.float32))
    with pytest.raises(BatchStateError, match="records dispatches only"):
        capturing.execute()


def test_capture_returns_the_backends_captured_work(backend, rng):
    x = rng.standard_normal(37).astype(np.float32)
    with Batch(backend, capture=True) as batch:
        y = pxvm.ops.scale(pxvm.ops.relu(x), 3.0)
    captured = batch.capture()
    if backend == "numpy":
        assert captured is None   # the ops already ran
        np.testing.assert_array_equal(y.numpy(), np.maximum(x, 0) * 3)
        return
    assert isinstance(captured, CapturedDispatches) and len(captured) == 2
    assert isinstance(captured.dispatches, DispatchList)
    for _ in range(2):
        replay = captured.encode([y])
        replay.submit()
        np.testing.assert_array_equal(replay.staged[0].result(np.float32, 37),
                                      np.maximum(x, 0) * 3)
    with pytest.raises(BatchStateError, match="already executed"):
        batch.capture()


def test_flush_in_a_capturing_batch_keeps_one_list(rng, gpu_device):
    with Batch("webgpu", capture=True) as b:
        y = pxvm.ops.relu(b.upload(rng.standard_normal(100).astype(np.float32)))
        b.flush()
        pxvm.ops.relu(y)
    assert len(b.capture()) == 2


# ---- Graph -------------------------------------------------------------------------

def _initial(rng):
    """Host values of the chain's tensors: a cached prefix of 5 positions, token 3."""
    return {
        "table": (rng.standard_normal((VOCAB, QKV))).astype(np.float32),
        "kc": rng.standard_normal((N_CTX, HKV, D)).astype(np.float32),
        "vc": rng.standard_normal((N_CTX, HKV, D)).astype(np.float32),
        "gain": (1.0 + 0.3 * rng.standard_normal(HQ * D)).astype(np.float32),
        "w_out": (rng.standard_normal((VOCAB, HQ * D)) * 2.0).astype(np.float32),
        "state": np.array([3, 5], np.int32),
    }


def _graph(backend, values, calls=None):
    be = pxvm.get_backend(backend)
    t = {name: be.from_numpy(values[name]) for name in ("kc", "vc", "gain", "state")}
    # F32 weights as raw GGUF rows (uint8 bytes)
    t["table_q"] = be.from_numpy(values["table"].view(np.uint8))
    w_out = be.from_numpy(values["w_out"].view(np.uint8))
    ops = pxvm.ops

    def record():
        if calls is not None:
            calls.append(1)
        # rows state[0] and state[1] of the table: the token's and the position's
        # embeddings, summed into the new token's qkv
        rows = ops.embedding_quant(t["state"], t["table_q"], qtype="F32", k=QKV)
        qkv = ops.add(ops.slice_rows(rows, 0, 1), ops.slice_rows(rows, 1, 2))
        att = transformer.attention_cached(qkv, t["kc"], t["vc"], t["state"], n_heads=HQ)
        logits = transformer.rmsnorm_matmul_quant(att, t["gain"], w_out, qtype="F32", k=HQ * D,
                                                  eps=1e-5)
        decoding.greedy_step(logits, t["state"])
        return {"state": t["state"], "logits": logits, "att": att, "kc": t["kc"]}

    return Graph(be, record), t


def _expected_runs(rng_values, n):
    """n sequential launches of the chain on the numpy backend: [(state, logits)]."""
    graph, _ = _graph("numpy", rng_values)
    return [graph.run("state", "logits") for _ in range(n)]


def _moving_initial(rng, n):
    """_initial values whose chain changes token within n launches (about 1 draw in 90
    settles on one token at once: then the feedback would go unchecked)."""
    while True:
        values = _initial(rng)
        if len({int(run["state"][0]) for run in _expected_runs(values, n)}) > 1:
            return values


def test_graph_on_webgpu_equals_graph_on_numpy_launch_by_launch(rng, gpu_device):
    values = _moving_initial(rng, 6)
    ref, ref_t = _graph("numpy", values)
    gpu, gpu_t = _graph("webgpu", values)
    tokens = []
    for step in range(6):
        want = ref.run("state", "logits", "att")
        got = gpu.run("state", "logits", "att")
        assert set(got) == {"state", "logits", "att"}
        np.testing.assert_array_equal(got["state"], want["state"])
        assert got["state"].tolist() == [int(np.argmax(want["logits"])), 6 + step]
        assert_close(got["logits"], want["logits"], NMSE_ELEMENTWISE)
        assert_close(got["att"], want["att"], NMSE_ELEMENTWISE)
        tokens.append(int(got["state"][0]))
    assert len(set(tokens)) > 1  # the token really fed back into the next launch
    # each launch appended its key and value at its position; the rest is untouched
    for name in ("kc", "vc"):
        g, c = gpu_t[name].numpy(), ref_t[name].numpy()
        assert_close(g[5:11], c[5:11], NMSE_ELEMENTWISE)
        np.testing.assert_array_equal(g[:5], values[name][:5])
        np.testing.assert_array_equal(g[11:], values[name][11:])
        assert not np.isin(g[5:11], values[name][5:11]).any()


def test_graph_launches_run_in_order_and_update_state(backend, rng):
    be = pxvm.get_backend(backend)
    logits = be.from_numpy(rng.standard_normal((4, 50)).astype(np.float32))
    state = be.from_numpy(np.array([0, 10], np.int32))
    expected = np.argmax(logits.numpy(), axis=1)

    def record():
        row = pxvm.ops.slice_rows(logits.reshape(4, 50), 0, 4)
        decoding.greedy_step(row, state)
        return {"state": state, "row": row}

    graph = Graph(be, record)
    assert (graph.dispatches is None) == (backend == "numpy")
    assert (graph.captured is None) == (backend == "numpy")
    launches = [graph.launch("state") for _ in range(3)]   # all submitted before reading
    positions = [launch.result()["state"][1] for launch in launches]
    assert positions == [11, 12, 13]
    assert launches[-1].result()["state"][0] == int(np.argmax(logits.numpy()))
    assert np.array_equal(np.argmax(graph.run("row")["row"], axis=1), expected)


@pytest.mark.parametrize("read_order", ["in order", "last first"])
def test_launches_submitted_before_reading_return_their_own_results_in_order(
        read_order, rng, gpu_device):
    values = _initial(rng)
    expected = _expected_runs(values, 5)
    graph, _ = _graph("webgpu", values)
    launches = [graph.launch("state", "logits") for _ in range(5)]  # nothing read yet
    order = range(5) if read_order == "in order" else reversed(range(5))
    results = {i: launches[i].result() for i in order}
    for i in range(5):
        np.testing.assert_array_equal(results[i]["state"], expected[i]["state"])
        assert results[i]["state"][1] == 6 + i
        assert_close(results[i]["logits"], expected[i]["logits"], NMSE_ELEMENTWISE)
        again = launches[i].result()  # reading again gives the same values
        assert all(np.array_equal(again[k], results[i][k]) for k in ("state", "logits"))


def test_prepared_launches_run_in_the_order_of_their_submits(backend, rng):
    graph, _ = _graph(backend, _initial(rng))
    first, second = graph.prepare("state"), graph.prepare("state")
    early = second.submit()        # encoded second, queued first
    late = first.submit()
    assert early.result()["state"][1] == 6 and late.result()["state"][1] == 7
    with pytest.raises(RuntimeError, match="already submitted"):
        first.submit()


def test_launch_with_runs_returns_each_runs_values_as_separate_launches_would(backend, rng):
    values = _initial(rng)
    expected = _expected_runs(values, 7)
    graph, _ = _graph(backend, values)
    first = graph.launch("state", "logits", runs=3)
    second = graph.launch("state", runs=4)  # queued before the first is read
    got, rest = first.result(), second.result()
    assert got["state"].shape == (3, 2)
    assert got["logits"].shape == (3, *expected[0]["logits"].shape)
    assert rest["state"].shape == (4, 2)
    for i in range(3):
        np.testing.assert_array_equal(got["state"][i], expected[i]["state"])
        assert_close(got["logits"][i], expected[i]["logits"], NMSE_ELEMENTWISE)
    for i in range(4):
        np.testing.assert_array_equal(rest["state"][i], expected[3 + i]["state"])
    # each run started from the state the previous one left (positions 6, 7, 8, then 9..)
    assert got["state"][:, 1].tolist() == [6, 7, 8]
    assert rest["state"][:, 1].tolist() == [9, 10, 11, 12]


def test_launch_with_runs_not_each_run_returns_only_the_last_runs_values(backend, rng):
    values = _initial(rng)
    expected = _expected_runs(values, 5)
    graph, _ = _graph(backend, values)
    first = graph.launch("state", "logits", runs=3, each_run=False)
    second = graph.prepare("state", runs=2, each_run=False).submit()
    got, rest = first.result(), second.result()
    np.testing.assert_array_equal(got["state"], expected[2]["state"])
    assert_close(got["logits"], expected[2]["logits"], NMSE_ELEMENTWISE)
    np.testing.assert_array_equal(rest["state"], expected[4]["state"])


def test_launch_with_runs_below_one_is_refused(backend, rng):
    graph, _ = _graph(backend, _initial(rng))
    with pytest.raises(ValueError, match="runs must be >= 1"):
        graph.launch("state", runs=0)
    with pytest.raises(ValueError, match="runs must be >= 1"):
        graph.prepare("state", runs=0)


def test_graph_dispatches_is_an_int_on_webgpu_and_none_on_numpy(rng, gpu_device):
    values = _initial(rng)
    gpu, _ = _graph("webgpu", values)
    ref, _ = _graph("numpy", values)
    assert type(gpu.dispatches) is int and gpu.dispatches >= 5  # at least one per op
    assert isinstance(gpu.captured, CapturedDispatches) and len(gpu.captured) == gpu.dispatches
    assert ref.dispatches is None and ref.captured is None


def test_record_runs_once_on_webgpu_and_per_launch_on_numpy(backend, rng):
    calls = []
    graph, _ = _graph(backend, _initial(rng), calls)
    for _ in range(3):
        graph.run("state")
    assert len(calls) == (1 if backend == "webgpu" else 3)


def test_rewinding_the_state_from_the_host_replays_the_same_step(backend, rng):
    # Tensor.write between launches is seen by the next launch: putting the state back
    # gives the same token, logits and cache rows again.
    graph, t = _graph(backend, _initial(rng))
    first = graph.run("state", "logits")
    second = graph.run("state", "logits")
    assert second["state"][1] == first["state"][1] + 1
    t["state"].write(np.array([3, 5], np.int32))
    again = graph.run("state", "logits")
    np.testing.assert_array_equal(again["state"], first["state"])
    np.testing.assert_array_equal(again["logits"], first["logits"])
    t["state"].write(first["state"])
    np.testing.assert_array_equal(graph.run("state")["state"], second["state"])


def test_launch_results_are_copies_the_next_launch_does_not_change(backend, rng):
    graph, _ = _graph(backend, _initial(rng))
    first = graph.run("state", "kc")
    kept = {k: v.copy() for k, v in first.items()}
    graph.run("state")
    for name in kept:
        np.testing.assert_array_equal(first[name], kept[name])


def test_a_timed_launch_reports_its_device_seconds(backend, rng):
    graph, _ = _graph(backend, _initial(rng))
    launch = graph.launch("state", timestamps=True)
    launch.result()
    if backend == "numpy" or not pxvm.get_backend("webgpu").device.has("timestamp-query"):
        assert launch.device_seconds is None
    else:
        assert launch.device_seconds is not None and 0 <= launch.device_seconds < 10
