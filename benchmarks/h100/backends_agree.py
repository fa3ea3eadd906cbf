"""WebGPU's and CUDA's logits for the same prompts on one model: every row of a prompt of
37 and of 300 tokens (recorded anew), then 40 more tokens after each; NMSE between the
backends and how often their argmax agrees. A whole-model check of the prompt kernels on
a real GPU (CUDA's prompts run on tensor cores in float16, WebGPU's in float32).
Usage: python backends_agree.py MODEL.gguf (e.g. explore_decode.sh's /tmp/shaped.gguf)."""
import sys

import numpy as np

from pxvm.llm.model import load_model

models = {b: load_model(sys.argv[1], backend=b, progress=False) for b in ("webgpu", "cuda")}
ids = np.random.default_rng(1).integers(0, models["cuda"].config.vocab_size, 400).astype(np.int32)


def nmse(x, y) -> float:
    return float(np.mean((x - y) ** 2) / np.mean(y ** 2))


for n in (37, 300):
    out = {}
    for name, model in models.items():
        model.reset()
        out[name] = (model.forward_all(ids[:n]), model.forward(ids[n:n + 40]))
    (w_all, w_next), (c_all, c_next) = out["webgpu"], out["cuda"]
    print(f"{n} tokens: NMSE webgpu vs cuda, all rows {nmse(w_all, c_all):.2e}, the next 40 "
          f"at depth {n} {nmse(w_next, c_next):.2e}; argmax equal in "
          f"{np.mean(w_all.argmax(1) == c_all.argmax(1)):.3f} of rows")
