"""Every model family pxvm runs (pxvm.llm.families), on tiny random-weight GGUF files
written as llama.cpp's converter writes that family's, against Hugging Face transformers
loading the same file: the logits of every prompt position, then greedy decoding through
the KV cache, on numpy, the fast CPU backend and WebGPU (lavapipe in CI).

Each file turns on what its family has: QKV biases (Qwen2), QK norm (Qwen3, Gemma 3),
GeGLU, post-norms, embedding scaling and alternating sliding-window layers (Gemma 2 and
3), soft-capped scores and logits (Gemma 2), local and global RoPE bases and linear RoPE
scaling (Gemma 3), fused QKV and gate-up matrices and LongRoPE (Phi-3), Llama 3's RoPE
frequency factors, Mistral's sliding window. Windows are shorter than the prompts, so
they change the answer. What HF's GGUF loader does not read from the metadata (the
attention's query scalar, soft-caps, RoPE scaling, windows) is passed to it as config.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pytest
from conftest import nmse
from make_tiny_gguf import TinySpec, write_tiny_gguf

from pxvm.llm import load_model
from pxvm.llm import model as model_module
from pxvm.ops import transformer

NMSE_FAMILY = 1e-5  # test_model.py's bound; measured ~1e-13 on numpy
#: prompts run in passes of this many tokens where a model has ring caches (pxvm's
#: default, 512, would need far longer prompts to wrap a ring)
RING_CHUNK = 16
PROMPT = 20
N_GREEDY = 8
HEAD = 16  # head size where a spec does not set one (dim 64 / 4 heads)


def llama3_rope_factors(theta, head_dim, factor, low, high, original):
    """Llama 3's per-pair RoPE divisors as llama.cpp's converter computes them from
    rope_scaling (written as the rope_freqs tensor)."""
    out = []
    for freq in theta ** (-np.arange(0, head_dim, 2) / head_dim):
        wavelength = 2 * math.pi / freq
        if wavelength < original / high:
            out.append(1.0)
        elif wavelength > original / low:
            out.append(factor)
        else:
            smooth = (original / wavelength - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(out)


@dataclass
class FamilyCase:
    spec: TinySpec
    hf_config: dict = field(default_factory=dict)  # what HF's GGUF loader leaves out
    max_context: int | None = None                 # pxvm's KV cache (LongRoPE's choice)
    prompt: int = PROMPT
    #: an HF model class to move the loaded weights into, with hf_config, where HF's GGUF
    #: loader cannot build the family's own class
    hf_as: str | None = None


_LLAMA3 = llama3_rope_factors(10000.0, HEAD, 8.0, 1.0, 4.0, 1024)
_SHORT = np.linspace(1.0, 2.5, HEAD // 2)   # LongRoPE's factors for short contexts
_LONG = np.linspace(1.0, 9.0, HEAD // 2)    # and for long ones
_PHI3_ATTN = math.sqrt(1 + math.log(64 / 32) / math.log(32))  # LongRoPE's, 64 of 32 positions


def _phi3(max_context, prompt):
    spec = TinySpec(arch="phi3", matrix_type="Q4_1", tied_output=False, context_length=64,
                    extra={"attention.sliding_window": 9,
                           "rope.scaling.attn_factor": _PHI3_ATTN,
                           "rope.scaling.original_context_length": 32},
                    extra_tensors={"rope_factors_short.weight": _SHORT,
                                   "rope_factors_long.weight": _LONG})
    longrope = {"rope_type": "longrope", "short_factor": _SHORT.tolist(),
                "long_factor": _LONG.tolist(), "original_max_position_embeddings": 32,
                "attention_factor": _PHI3_ATTN, "rope_theta": 10000.0}
    return FamilyCase(spec, {"sliding_window": 9, "rope_parameters": longrope,
                             "original_max_position_embeddings": 32,
                             "pad_token_id": 0, "bos_token_id": 1, "eos_token_id": 2},
                      max_context, prompt)


CASES = {
    "qwen2": FamilyCase(TinySpec(arch="qwen2", matrix_type="Q4_0", context_length=64)),
    "qwen3": FamilyCase(TinySpec(arch="qwen3", head_dim=32, matrix_type="Q8_0",
                                 context_length=64, tied_output=False),
                        {"head_dim": 32}),
    "gemma2": FamilyCase(
        TinySpec(arch="gemma2", head_dim=32, matrix_type="Q5_0", context_length=64,
                 extra={"attention.sliding_window": 6, "attn_logit_softcapping": 2.0,
                        "final_logit_softcapping": 3.0}),
        {"query_pre_attn_scalar": 32, "attn_logit_softcapping": 2.0,
         "final_logit_softcapping": 3.0}),
    # 7 layers: five local, one global, one local
    "gemma3": FamilyCase(
        TinySpec(arch="gemma3", n_layers=7, head_dim=32, matrix_type="Q8_0", context_length=64,
                 rope_theta=1e6, extra={"attention.sliding_window": 6}),
        {"query_pre_attn_scalar": 32}),
    "gemma3-linear-rope": FamilyCase(
        TinySpec(arch="gemma3", n_layers=7, head_dim=32, matrix_type="Q5_1", context_length=64,
                 rope_theta=1e6, extra={"attention.sliding_window": 6,
                                        "rope.scaling.type": "linear",
                                        "rope.scaling.factor": 8.0}),
        {"query_pre_attn_scalar": 32,
         "rope_parameters": {"full_attention": {"rope_type": "linear", "factor": 8.0,
                                                "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default",
                                                   "rope_theta": 10000.0}}}),
    # 100 positions through sliding-window layers whose caches are rings of 64 rows
    # (RING_CHUNK-token passes): keys wrap around the ring while the prompt runs and again
    # while decoding
    "gemma2-ring": FamilyCase(
        TinySpec(arch="gemma2", head_dim=32, matrix_type="Q8_0", context_length=256,
                 extra={"attention.sliding_window": 6, "attn_logit_softcapping": 2.0}),
        {"query_pre_attn_scalar": 32, "attn_logit_softcapping": 2.0,
         "final_logit_softcapping": None}, prompt=100),
    "phi3-short-rope": _phi3(32, PROMPT),
    "phi3-long-rope": _phi3(64, 40),  # a cache past the original 32 positions: long factors
    "llama3": FamilyCase(
        TinySpec(matrix_type="Q8_0", context_length=64,
                 extra_tensors={"rope_freqs.weight": _LLAMA3}),
        {"rope_parameters": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                             "high_freq_factor": 4.0, "original_max_position_embeddings": 1024,
                             "rope_theta": 10000.0}}),
    # Mistral's files are llama-architecture ones (with a window here); HF's GGUF loader
    # cannot build Mistral from them with this gguf-py, so the weights move into one
    "mistral": FamilyCase(TinySpec(name="mistral-7b", matrix_type="Q5_1", context_length=64,
                                   extra={"attention.sliding_window": 7}),
                          {"sliding_window": 7}, hf_as="Mistral"),
}


@pytest.fixture(autouse=True)
def short_prompt_passes(monkeypatch):
    monkeypatch.setattr(model_module, "PROMPT_CHUNK", RING_CHUNK)


def _check_caches(model, case):
    """Sliding-window layers of a model whose context exceeds the ring keep a ring."""
    rows = [t.shape[0] for t in model.k_cache]
    local = set(model.config.local_layers)
    ring = transformer.cached_rows(model.config.window, RING_CHUNK, model.context_length)
    assert rows == [ring if i in local else model.context_length for i in range(len(rows))]
    if case.spec.context_length == 256:
        assert ring == 64 and local


@pytest.fixture(scope="module", params=list(CASES))
def family(request, tmp_path_factory):
    """(case, file path, prompt ids, HF logits of prompt + continuation, HF's greedy
    continuation)."""
    torch = pytest.importorskip("torch", reason="the comparison needs torch")
    transformers = pytest.importorskip("transformers", reason="the comparison needs transformers")
    case = CASES[request.param]
    directory = tmp_path_factory.mktemp(request.param)
    rng = np.random.default_rng(sum(map(ord, request.param)))
    write_tiny_gguf(directory / "model.gguf", case.spec, rng)
    if case.hf_as is None:
        hf = transformers.AutoModelForCausalLM.from_pretrained(
            directory, gguf_file="model.gguf", dtype=torch.float32, **case.hf_config)
    else:
        loaded = transformers.AutoModelForCausalLM.from_pretrained(
            directory, gguf_file="model.gguf", dtype=torch.float32)
        config = getattr(transformers, f"{case.hf_as}Config")(
            **{**loaded.config.to_dict(), **case.hf_config})
        hf = getattr(transformers, f"{case.hf_as}ForCausalLM")(config)
        hf.load_state_dict(loaded.state_dict())
    hf.eval()
    ids = rng.integers(3, case.spec.vocab_size, case.prompt).tolist()
    with torch.no_grad():
        out = hf.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY,
                          min_new_tokens=N_GREEDY, do_sample=False, pad_token_id=0)
        logits = hf(out).logits[0].double().numpy()
    return case, str(directory / "model.gguf"), ids, logits, out[0, len(ids):].tolist()


def test_every_family_is_covered():
    from pxvm.llm.families import FAMILIES

    assert set(FAMILIES) <= {c.spec.arch for c in CASES.values()}


def test_numpy_matches_transformers_at_every_position_and_decodes_greedily(family):
    case, path, ids, hf_logits, hf_tokens = family
    model = load_model(path, backend="numpy", progress=False, max_context=case.max_context)
    assert model.config.family.arch == case.spec.arch
    _check_caches(model, case)
    prompt_logits = model.forward_all(ids)
    assert nmse(prompt_logits, hf_logits[: len(ids)]) <= NMSE_FAMILY
    # through the KV cache: each decoded token's logits, and the tokens chosen
    tokens = [int(np.argmax(prompt_logits[-1]))]
    for step in range(N_GREEDY - 1):
        logits = model.forward([tokens[-1]])
        assert nmse(logits, hf_logits[len(ids) + step]) <= NMSE_FAMILY
        tokens.append(int(np.argmax(logits)))
    assert tokens == hf_tokens
    # and the device-side decoding loop picks the same tokens
    model.reset()
    first = int(np.argmax(model.forward(ids)))
    assert [first, *model.decode(first, N_GREEDY - 1)] == hf_tokens


@pytest.mark.parametrize("backend", ["cpu", "webgpu"])
def test_fast_backends_match_transformers(backend, family, request):
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    case, path, ids, hf_logits, hf_tokens = family
    model = load_model(path, backend=backend, progress=False, max_context=case.max_context)
    _check_caches(model, case)
    logits = model.forward(ids)
    assert nmse(logits, hf_logits[len(ids) - 1]) <= NMSE_FAMILY
    first = int(np.argmax(logits))
    assert [first, *model.decode(first, N_GREEDY - 1)] == hf_tokens
