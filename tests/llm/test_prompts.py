"""Prompts replayed as captured graphs (pxvm.llm.prompts): a piece length met a second
time runs as a graph at any position and fills the KV cache as recording anew does, a
long prompt's full pieces share one graph, few graphs are kept, and a graph over its
memory bound is dropped. Against the numpy backend on tiny random GGUF files: logits
and the greedy tokens decoded after the prompt (which read the cache the graph
filled). On CUDA, where prompts take graphs, and on WebGPU with them switched on (it
records graphs the same way; CI runs it on lavapipe)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf
from test_model import NMSE_MODEL

from pxvm.llm import load_model
from pxvm.llm import model as model_module
from pxvm.llm import prompts

# heads of 64 and a GLU of 128: prompts' attention and GLU on CUDA take the tensor cores
SPEC = TinySpec(dim=128, n_heads=2, n_kv_heads=1, ffn_dim=128, context_length=400,
                matrix_type="Q8_0", embedding_type="Q8_0", matrix_types=None)


@pytest.fixture(params=["webgpu", "cuda"])
def backend(request):
    """A backend whose models replay prompts as graphs (both do by default)."""
    request.getfixturevalue("gpu_device" if request.param == "webgpu" else "cuda_device")
    return request.param


def _models(tmp_path, rng, backend, spec=SPEC):
    """(the numpy model, the `backend` one), with KV caches of the type the backend's
    kv_cache="auto" takes."""
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, spec, rng)
    model = load_model(str(path), backend=backend, progress=False)
    return (load_model(str(path), backend="numpy", progress=False, kv_cache=model.kv_cache),
            model)


def _same_run(reference, model, prompts_in_order, decoded=4):
    """Feed the prompts (None: reset) to both models, comparing each prompt's logits,
    then the greedy tokens decoded after the last."""
    for ids in prompts_in_order:
        if ids is None:
            reference.reset()
            model.reset()
            continue
        expected = reference.forward(ids)
        assert nmse(model.forward(ids), expected) <= NMSE_MODEL
    assert model.position == reference.position
    first = int(np.argmax(expected))
    assert list(model.decode(first, decoded)) == list(reference.decode(first, decoded))


def test_a_piece_length_met_again_runs_as_a_graph_at_any_position(backend, tmp_path, rng):
    reference, model = _models(tmp_path, rng, backend)
    a, b, c = (rng.integers(0, 101, 80).tolist() for _ in range(3))
    _same_run(reference, model, [a])
    assert model.prompt_graphs.lengths == []  # met once: recorded anew
    _same_run(reference, model, [None, a, b])  # b at position 80 runs as the graph
    assert model.prompt_graphs.lengths == [80]
    _same_run(reference, model, [None, c])  # the same graph at position 0


def test_a_long_prompt_shares_one_graph_for_its_full_pieces(backend, tmp_path, rng,
                                                            monkeypatch):
    monkeypatch.setattr(model_module, "PIECE_TOKENS", 64)
    reference, model = _models(tmp_path, rng, backend)
    ids = rng.integers(0, 101, 3 * 64 + 10).tolist()  # 64 anew, then the graph twice, 10 anew
    _same_run(reference, model, [ids])
    assert model.prompt_graphs.lengths == [64]


def test_the_most_recently_used_graphs_are_kept(backend, tmp_path, rng):
    reference, model = _models(tmp_path, rng, backend)
    for n in (70, 80, 90):
        for _ in range(2):
            _same_run(reference, model, [None, rng.integers(0, 101, n).tolist()], decoded=1)
    assert model.prompt_graphs.lengths == [80, 90][-prompts.GRAPHS_KEPT:]


def test_a_graph_over_its_memory_bound_is_dropped(backend, tmp_path, rng, monkeypatch):
    monkeypatch.setattr(prompts, "GRAPH_BYTES", 0)
    reference, model = _models(tmp_path, rng, backend)
    ids = rng.integers(0, 101, 80).tolist()
    _same_run(reference, model, [ids, None, ids, None, ids])
    assert model.prompt_graphs.lengths == []


def test_models_with_sliding_window_rings_record_their_prompts_anew(backend, tmp_path, rng):
    spec = dataclasses.replace(SPEC, arch="gemma3", n_layers=2, head_dim=32,
                               context_length=4096, extra={"attention.sliding_window": 6})
    _, model = _models(tmp_path, rng, backend, spec)
    assert model.prompt_graphs is None
