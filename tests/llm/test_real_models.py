"""Real GGUF models of families other than llama (real_models.py) against Hugging Face
transformers loading the same file: the prompt's logits and greedy continuations, on
numpy, the fast CPU backend and WebGPU (lavapipe in CI). Tiny random files cover every
family (test_families.py); these show the same on weights a model was trained with."""

from __future__ import annotations

import numpy as np
import pytest
from conftest import nmse
from real_models import REAL_MODELS, real_model

from pxvm.backends.webgpu.ops import quantized as webgpu_quantized
from pxvm.core import tuning
from pxvm.llm import load_model
from pxvm.llm.tokenizer import Tokenizer

NMSE_HF = 1e-4  # test_against_transformers.py's bound
N_GREEDY = 16
PROMPTS = ["The capital of France is", "Once upon a time, there was a little robot who"]


@pytest.fixture(scope="module", params=list(REAL_MODELS))
def reference(request):
    """(path, tokenizer, [(prompt ids, HF logits of prompt + continuation, HF's greedy
    continuation)])."""
    torch = pytest.importorskip("torch", reason="the comparison needs torch")
    transformers = pytest.importorskip("transformers", reason="the comparison needs transformers")
    path = real_model(request.param)
    hf = transformers.AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name,
                                                           dtype=torch.float32)
    hf.eval()
    tokenizer = Tokenizer(load_model(str(path), backend="numpy", progress=False,
                                     max_context=8).metadata)
    runs = []
    with torch.no_grad():
        for prompt in PROMPTS:
            ids = tokenizer.encode(prompt)
            out = hf.generate(torch.tensor([ids]), max_new_tokens=N_GREEDY, do_sample=False,
                              min_new_tokens=N_GREEDY)
            runs.append((ids, hf(out).logits[0].double().numpy(), out[0, len(ids):].tolist()))
    return str(path), tokenizer, runs


@pytest.mark.parametrize("backend", ["numpy", "cpu", "webgpu", "webgpu matvec"])
def test_real_model_matches_transformers_and_decodes_the_same_text(backend, reference, request):
    # "webgpu matvec": decoding's Q4_K, Q6_K and Q8_0 products in `matvec`, which GPUs
    # take and lavapipe takes only when its shape is forced
    if backend.startswith("webgpu"):
        request.getfixturevalue("gpu_device")
    path, tokenizer, runs = reference
    shape = (64, 4) if backend == "webgpu matvec" else None
    with tuning.forcing(webgpu_quantized.MATVEC_TUNED, shape):
        model = load_model(path, backend=backend.split()[0], progress=False, max_context=64)
        for ids, hf_logits, hf_tokens in runs if backend in ("numpy", "cpu") else runs[:1]:
            model.reset()
            logits = model.forward_all(ids)
            assert nmse(logits, hf_logits[: len(ids)]) <= NMSE_HF
            first = int(np.argmax(logits[-1]))
            tokens = [first, *model.decode(first, N_GREEDY - 1)]
            assert tokenizer.decode(tokens) == tokenizer.decode(hf_tokens)
            assert tokens == hf_tokens
