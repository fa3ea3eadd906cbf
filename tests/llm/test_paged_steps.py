"""The engine's steps over a paged cache (pxvm.llm.paged_steps): decoding steps through
graphs padded to a few batch sizes give each sequence the logits the single-sequence
Model (its own cache: attention_cached) gives it; the padding tokens touch no block a
sequence holds."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf
from test_model import NMSE_MODEL

from pxvm.llm import load_model
from pxvm.llm.paged_steps import PagedSteps, graph_sizes

BLOCK = 4


@pytest.mark.parametrize("most", [1, 3, 8, 9, 64, 100, 256])
def test_graph_sizes_pad_a_batch_by_at_most_half_from_eight_rows(most):
    sizes = graph_sizes(most)
    assert sizes[0] == 1 and sizes[-1] == most and sizes == sorted(set(sizes))
    for n in range(1, most + 1):
        padded = next(s for s in sizes if s >= n)
        assert padded <= max(2 * n - 1, 3 * n // 2, 4)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_padded_decoding_steps_give_each_sequence_its_single_sequence_logits(backend, tmp_path,
                                                                              rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=32), rng)
    model = load_model(str(path), backend=backend, progress=False)
    prompts = [rng.integers(3, 101, n).tolist() for n in (6, 3, 9)]
    cache = model.paged_cache(BLOCK, blocks=12)
    scratch = 11
    blocks = np.array([[0, 1, 2], [3, 4, 5], [6, 7, 8]], np.int32)  # 12 positions each
    before = [np.asarray(p.numpy()).copy() for p in cache.k_pools]
    steps = PagedSteps(model, cache, scratch=scratch, width=8, max_batch=8)  # 3 pads to 4
    # the prompts in one pass (recorded anew), then two decoding steps (a graph)
    ids = sum(prompts, [])
    table = np.array([(s, p) for s, prompt in enumerate(prompts) for p in range(len(prompt))],
                     np.int32)
    steps.run(np.array(ids, np.int32), table, blocks, 1)
    fed = [[5, 17], [88, 2], [40, 40]]
    for step in range(2):
        tokens = np.array([f[step] for f in fed], np.int32)
        positions = [len(p) + step for p in prompts]
        logits = steps.run(tokens, np.array(list(enumerate(positions)), np.int32), blocks, 3)
    assert steps.recorded == [(4, 8)]  # 3 tokens padded to 4, tables of 3 to 8 blocks
    for s, prompt in enumerate(prompts):
        model.reset()
        expected = model.forward(prompt + fed[s])
        assert nmse(logits[s], expected) <= NMSE_MODEL
    # blocks no sequence holds (9, 10) are as they were; the padding wrote the scratch only
    after = [np.asarray(p.numpy()) for p in cache.k_pools]
    for old, new in zip(before, after):
        np.testing.assert_array_equal(new[9:11], old[9:11])


@pytest.mark.parametrize("backend", ["numpy", "cpu", "webgpu", "cuda"])
def test_a_greedy_step_gives_the_argmax_of_the_logits_the_same_step_gives(backend, tmp_path,
                                                                         rng, request):
    if backend in ("webgpu", "cuda"):
        request.getfixturevalue({"webgpu": "gpu_device", "cuda": "cuda_device"}[backend])
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=32), rng)
    model = load_model(str(path), backend=backend, progress=False)
    cache = model.paged_cache(BLOCK, blocks=8)
    steps = PagedSteps(model, cache, scratch=7, width=8, max_batch=4)
    blocks = np.array([[0, 1], [2, 3], [4, 5]], np.int32)
    prompts = [rng.integers(3, 101, n).tolist() for n in (5, 2, 7)]
    ids = np.array(sum(prompts, []), np.int32)
    table = np.array([(s, p) for s, prompt in enumerate(prompts) for p in range(len(prompt))],
                     np.int32)
    # a step recorded anew (prompts: each sequence's last token samples), then a graph's;
    # each run twice, writing the same keys and values again
    last = np.cumsum([len(p) for p in prompts]) - 1
    order = np.r_[np.setdiff1d(np.arange(len(ids)), last), last]
    steps_args = [(ids[order], table[order], blocks, 3),
                  (np.array([9, 30, 61], np.int32),
                   np.array([(s, len(p)) for s, p in enumerate(prompts)], np.int32), blocks, 3)]
    for args in steps_args:
        logits = steps.run(*args)
        tokens = steps.run(*args, greedy=True)
        assert tokens.dtype == np.int32 and tokens.shape == (3,)
        np.testing.assert_array_equal(tokens, np.argmax(logits, axis=-1))
    assert steps.recorded == [(4, 8)]
