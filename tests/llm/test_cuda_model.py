"""The language model (pxvm.llm.model, the one implementation for every backend) on the
CUDA backend, against the numpy backend on tiny random GGUF files: the logits of every
prompt position, each decoded token's logits through the KV cache, and the tokens
chosen by the device-side decoding loop (captured steps, greedy and sampled, across the
recorded steps' key bounds); every family's features with Q8_0 weights, and every other
tensor type where matmul_quant's CUDA kernel reads it (skipped with its
MissingKernelError until then); the launches of a decoding step's layer; and `pxvm
generate`, `pxvm bench llm --backend cuda` on a tiny model. Skipped, saying why, without
a driver."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf
from test_families import CASES as FAMILY_CASES
from test_families import RING_CHUNK
from test_model import NMSE_MODEL, SPECS
from typer.testing import CliRunner

from pxvm.cli import app
from pxvm.llm import load_model
from pxvm.llm import model as model_module
from pxvm.ops.decoding import sampled_logits
from pxvm.ops.registry import MissingKernelError

N_DECODED = 8


def _q8_0(spec: TinySpec) -> TinySpec:
    """The spec with every matrix, the embedding and the LM head in Q8_0."""
    return dataclasses.replace(spec, matrix_type="Q8_0", embedding_type="Q8_0",
                               matrix_types=None)


def _models(path, max_context=None):
    """(the numpy model, the CUDA model) of one file, with KV caches of one type (the one
    CUDA's kv_cache="auto" takes)."""
    model = load_model(str(path), backend="cuda", progress=False, max_context=max_context)
    return (load_model(str(path), backend="numpy", progress=False, max_context=max_context,
                       kv_cache=model.kv_cache), model)


def _compare(reference, model, ids):
    """Prompt logits at every position, then each decoded token's logits fed one at a
    time (a captured step each), then greedy decoding chained on the device."""
    assert nmse(model.forward_all(ids), reference.forward_all(ids)) <= NMSE_MODEL
    reference.reset()
    model.reset()
    expected = reference.forward(ids)
    got = model.forward(ids)
    assert nmse(got, expected) <= NMSE_MODEL
    token = int(np.argmax(expected))
    for step in range(3):
        expected, got = reference.forward([token]), model.forward([token])
        assert nmse(got, expected) <= NMSE_MODEL, f"decoded token {step}"
        token = int(np.argmax(expected))
    assert model.position == reference.position == len(ids) + 3
    reference.reset()
    model.reset()
    first = int(np.argmax(reference.forward(ids)))
    assert int(np.argmax(model.forward(ids))) == first
    assert list(model.decode(first, N_DECODED)) == list(reference.decode(first, N_DECODED))
    assert model.position == len(ids) + N_DECODED


@pytest.mark.parametrize("family", list(FAMILY_CASES))
def test_every_family_in_q8_0_matches_the_numpy_backend(family, cuda_device, tmp_path, rng,
                                                         monkeypatch):
    # QKV biases, QK norm, GeGLU, post-norms, embedding scaling, sliding windows with
    # ring caches, soft-caps, RoPE scalings, fused QKV and gate-up matrices
    monkeypatch.setattr(model_module, "PROMPT_CHUNK", RING_CHUNK)
    case = FAMILY_CASES[family]
    spec = _q8_0(case.spec)
    path = tmp_path / "model.gguf"
    write_tiny_gguf(path, spec, rng)
    ids = rng.integers(3, spec.vocab_size, case.prompt).tolist()
    reference, model = _models(path, case.max_context)
    assert model.backend_name == "cuda"
    _compare(reference, model, ids)


@pytest.mark.parametrize("name", sorted(SPECS))
def test_every_tensor_type_matches_the_numpy_backend(name, cuda_device, tmp_path, rng):
    spec = SPECS[name]
    path = tmp_path / f"{name}.gguf"
    write_tiny_gguf(path, spec, rng)
    ids = rng.integers(0, spec.vocab_size, size=11).tolist()
    reference, model = _models(path)
    try:
        model.forward(ids[:2])
    except MissingKernelError as exc:
        pytest.skip(f"not on CUDA yet: {exc}")
    model.reset()
    _compare(reference, model, ids)


@pytest.mark.parametrize("prompt_len", [58, 250])
def test_greedy_and_sampled_decoding_across_step_bounds_match_the_numpy_backend(
        prompt_len, cuda_device, tmp_path, rng):
    # Context 300: decoding crosses from the step recorded for 64 keys to the one for
    # 256 (keys cut into ranges), then to the whole context's.
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, _q8_0(TinySpec(context_length=300)), rng)
    prompt = rng.integers(0, 101, size=prompt_len).tolist()
    reference, model = _models(path)
    first = int(np.argmax(reference.forward(prompt)))
    expected = list(reference.decode(first, 12))
    model.forward(prompt)
    assert list(model.decode(first, 12)) == expected
    assert len(model.decoder.recorded) == 2

    temperature, seed = 100.0, 4321  # the tiny model's logits are peaked
    reference.reset()
    model.reset()
    logits = reference.forward(prompt)
    first = int(np.argmax(sampled_logits(logits, temperature, seed, prompt_len - 1)))
    expected = list(reference.decode(first, 12, temperature, seed))
    model.forward(prompt)
    assert list(model.decode(first, 12, temperature, seed)) == expected


def test_warm_up_leaves_no_trace(cuda_device, tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, _q8_0(TinySpec(context_length=100)), rng)
    prompt = rng.integers(0, 101, size=70).tolist()
    cold = load_model(str(path), backend="cuda", progress=False)
    warm = load_model(str(path), backend="cuda", progress=False, warm_up=True)
    assert warm.position == 0 and warm.decoder.recorded
    expected = cold.forward(prompt)
    assert nmse(warm.forward(prompt), expected) <= 1e-10
    first = int(np.argmax(expected))
    assert list(warm.decode(first, 6)) == list(cold.decode(first, 6))


#: Launches of a decoding step a layer: the norm with the QKV product, the attention with
#: RoPE and the cache's append, the output product with its residual, the norm with the
#: gate/up product and the GLU, the down product with its residual (each norm, residual
#: add, GLU and the append apart, there were 11)
LAUNCHES_PER_LAYER = 5


def test_a_decoding_step_fuses_each_layer_into_five_launches(cuda_device, tmp_path, rng):
    launches = {}
    for layers in (1, 3):  # what the layers add, whatever the step's first and last launches
        path = tmp_path / f"layers{layers}.gguf"
        write_tiny_gguf(path, _q8_0(TinySpec(n_layers=layers)), rng)
        model = load_model(str(path), backend="cuda", progress=False)
        launches[layers] = model.decoder.step(0).dispatches
    assert launches[3] - launches[1] == 2 * LAUNCHES_PER_LAYER


# ---- the commands ----------------------------------------------------------------------

def _spelling_model(path) -> str:
    """A tiny Q8_0 model whose vocabulary spells any text (SentencePiece byte tokens)."""
    tokens = ["<unk>", "<s>", "</s>", *(f"<0x{b:02X}>" for b in range(256)), "\u2581",
              *"abcdefghijklmnopqrstuvwxyz"]
    tokens += [f"x{i}" for i in range(300 - len(tokens))]
    spec = TinySpec(n_layers=2, dim=64, n_heads=4, n_kv_heads=2, ffn_dim=96, vocab_size=300,
                    context_length=96, matrix_type="Q8_0", embedding_type="Q8_0",
                    tokens=tokens)
    write_tiny_gguf(path, spec, np.random.default_rng(7))
    return str(path)


def test_pxvm_generate_on_cuda_writes_what_numpy_writes(cuda_device, tmp_path):
    model = _spelling_model(tmp_path / "spell.gguf")
    runner = CliRunner()
    outputs = {}
    for backend in ("numpy", "cuda"):
        result = runner.invoke(app, ["generate", "hello world", "--model", model, "--backend",
                                     backend, "--max-tokens", "24"])
        assert result.exit_code == 0, result.output
        text, stats = result.output.rsplit("\n", 2)[:2]
        assert f"backend: {backend}" in stats and "tokens/s" in stats
        outputs[backend] = text
    assert outputs["cuda"] == outputs["numpy"]


def test_pxvm_bench_llm_on_cuda_profiles_decoding(cuda_device, tmp_path):
    model = _spelling_model(tmp_path / "spell.gguf")
    out = tmp_path / "bench.json"
    result = CliRunner().invoke(app, ["bench", "llm", "--model", model, "--backend", "cuda",
                                      "--prompt-tokens", "40", "--gen-tokens", "8",
                                      "--repeats", "1", "--profile", "--output", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert data["backend"] == "cuda" and data["decode_tokens_per_s"] > 0
    profile = data["decode_profile"]
    assert profile["dispatches_per_token"] > 0 and profile["gpu_kernel_ms_by_kernel"]
