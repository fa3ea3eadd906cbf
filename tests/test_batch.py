"""batch.Graph: a chain recorded once and launched again and again (a decoding step).

The chain here is a toy decoder whose state never leaves the device: the current token
(state[0]) and the position (state[1]) pick rows of an embedding table that sum to the
new qkv, attention_cached appends to the KV cache at that position, a normed product
gives logits and greedy_step writes the next token and advances the position. On the
numpy backend the same chain simply runs again per launch, the reference for the GPU's
replays."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, assert_close

import pxvm
from pxvm.batch import Graph
from pxvm.ops.elementwise import gelu_ref

HQ, HKV, D, N_CTX, VOCAB = 2, 1, 8, 48, 64
QKV = (HQ + 2 * HKV) * D


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
    be = pxvm.backends.get_backend(backend)
    t = {name: be.from_numpy(values[name]) for name in ("kc", "vc", "gain", "state")}
    # F32 weights as raw GGUF rows (uint8 bytes)
    t["table_q"] = be.from_numpy(values["table"].view(np.uint8))
    w_out = be.from_numpy(values["w_out"].view(np.uint8))

    def record(b):
        if calls is not None:
            calls.append(1)
        # rows state[0] and state[1] of the table: the token's and the position's
        # embeddings, summed into the new token's qkv
        rows = b.embedding_quant(t["state"], t["table_q"], qtype=0, k=QKV)
        qkv = b.add(b.slice_rows(rows, 0, 1), b.slice_rows(rows, 1, 2))
        att = b.attention_cached(qkv, t["kc"], t["vc"], t["state"], n_heads=HQ)
        logits = b.rmsnorm_matmul_quant(att, t["gain"], w_out, qtype=0, k=HQ * D, eps=1e-5)
        b.greedy_step(logits, t["state"])
        return {"state": t["state"], "logits": logits, "att": att, "kc": t["kc"]}

    return Graph(be, record), t


def _expected_runs(rng_values, n):
    """n sequential launches of the chain on the numpy backend: [(state, logits)]."""
    graph, _ = _graph("cpu", rng_values)
    return [graph.run("state", "logits") for _ in range(n)]


def test_graph_on_gpu_equals_graph_on_cpu_launch_by_launch(rng, gpu_device):
    values = _initial(rng)
    cpu, cpu_t = _graph("cpu", values)
    gpu, gpu_t = _graph("gpu", values)
    tokens = []
    for step in range(6):
        want = cpu.run("state", "logits", "att")
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
        g, c = gpu_t[name].numpy(), cpu_t[name].numpy()
        assert_close(g[5:11], c[5:11], NMSE_ELEMENTWISE)
        np.testing.assert_array_equal(g[:5], values[name][:5])
        np.testing.assert_array_equal(g[11:], values[name][11:])
        assert not np.isin(g[5:11], values[name][5:11]).any()


@pytest.mark.parametrize("read_order", ["in order", "last first"])
def test_launches_submitted_before_reading_return_their_own_results_in_order(
        read_order, rng, gpu_device):
    values = _initial(rng)
    expected = _expected_runs(values, 5)
    graph, _ = _graph("gpu", values)
    launches = [graph.launch("state", "logits") for _ in range(5)]  # nothing read yet
    order = range(5) if read_order == "in order" else reversed(range(5))
    results = {i: launches[i].result() for i in order}
    for i in range(5):
        np.testing.assert_array_equal(results[i]["state"], expected[i]["state"])
        assert results[i]["state"][1] == 6 + i
        assert_close(results[i]["logits"], expected[i]["logits"], NMSE_ELEMENTWISE)
        again = launches[i].result()  # reading again gives the same values
        assert all(np.array_equal(again[k], results[i][k]) for k in ("state", "logits"))


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_launch_with_runs_returns_each_runs_values_as_separate_launches_would(
        backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
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


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_launch_with_runs_not_each_run_returns_only_the_last_runs_values(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    values = _initial(rng)
    expected = _expected_runs(values, 5)
    graph, _ = _graph(backend, values)
    first = graph.launch("state", "logits", runs=3, each_run=False)
    second = graph.launch("state", runs=2, each_run=False)
    got, rest = first.result(), second.result()
    np.testing.assert_array_equal(got["state"], expected[2]["state"])
    assert_close(got["logits"], expected[2]["logits"], NMSE_ELEMENTWISE)
    np.testing.assert_array_equal(rest["state"], expected[4]["state"])


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_launch_with_runs_below_one_is_refused(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    graph, _ = _graph(backend, _initial(rng))
    with pytest.raises(ValueError, match="runs must be >= 1"):
        graph.launch("state", runs=0)


def test_graph_dispatches_is_an_int_on_gpu_and_none_on_cpu(rng, gpu_device):
    values = _initial(rng)
    gpu, _ = _graph("gpu", values)
    cpu, _ = _graph("cpu", values)
    assert type(gpu.dispatches) is int and gpu.dispatches >= 5  # at least one per op
    assert cpu.dispatches is None


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_record_runs_once_on_gpu_and_per_launch_on_cpu(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    calls = []
    graph, _ = _graph(backend, _initial(rng), calls)
    for _ in range(3):
        graph.run("state")
    assert len(calls) == (1 if backend == "gpu" else 3)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_rewinding_the_state_from_the_host_replays_the_same_step(backend, rng, request):
    # Tensor.write between launches is seen by the next launch: putting the state back
    # gives the same token, logits and cache rows again.
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
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


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_launch_results_are_copies_the_next_launch_does_not_change(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    graph, _ = _graph(backend, _initial(rng))
    first = graph.run("state", "kc")
    kept = {k: v.copy() for k, v in first.items()}
    graph.run("state")
    for name in kept:
        np.testing.assert_array_equal(first[name], kept[name])


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_launch_gpu_seconds(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    graph, _ = _graph(backend, _initial(rng))
    launch = graph.launch("state", timestamps=True)
    launch.result()
    if backend == "cpu" or not pxvm.backends.get_backend("gpu").device.has("timestamp-query"):
        assert launch.gpu_seconds is None
    else:
        assert launch.gpu_seconds is not None and 0 <= launch.gpu_seconds < 10


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_flushed_batches_give_what_one_submit_gives(backend, rng, request):
    # Layers of a chain submitted as they are queued (each reads the last one's output,
    # buffers freed in between are reused) against the same chain in one submit.
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    x0 = rng.standard_normal((37, 29)).astype(np.float32)
    w = [rng.standard_normal((29, 29)).astype(np.float32) * 0.3 for _ in range(6)]

    def run(flush: bool):
        b = pxvm.Batch(backend)
        x = b.upload(x0)
        for wi in w:
            x = b.gelu(b.add(b.matmul(x, wi), x))
            if flush:
                b.flush()
        b.execute()
        return b.read(x)

    expected = x0
    for wi in w:
        expected = gelu_ref(expected @ wi + expected)
    assert_close(run(True), expected, NMSE_ELEMENTWISE)
    np.testing.assert_array_equal(run(True), run(False))


def test_flush_in_a_capturing_batch_keeps_one_list(rng, gpu_device):
    b = pxvm.Batch("gpu", capture=True)
    y = b.relu(b.upload(rng.standard_normal(100).astype(np.float32)))
    b.flush()
    b.relu(y)
    assert len(b.capture()) == 2
