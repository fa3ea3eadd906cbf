"""Greedy text of a GGUF model through pxvm and through Hugging Face transformers loading
the same file, side by side, with the prompt logits' NMSE: the check the families issue
asks of every real model one can install.

    python benchmarks/families/greedy_vs_transformers.py MODEL.gguf [--backend B ..]
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import torch
import transformers

from pxvm.llm import load_model
from pxvm.llm.tokenizer import Tokenizer

PROMPTS = ["The capital of France is", "Once upon a time, there was a little robot who"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model")
    parser.add_argument("--backend", nargs="+", default=["numpy"])
    parser.add_argument("--tokens", type=int, default=32)
    args = parser.parse_args()
    directory, name = os.path.split(os.path.abspath(args.model))
    t = time.perf_counter()
    hf = transformers.AutoModelForCausalLM.from_pretrained(directory, gguf_file=name,
                                                           dtype=torch.float32).eval()
    print(f"transformers {transformers.__version__} loaded {name} in "
          f"{time.perf_counter() - t:.1f} s")
    tokenizer = None
    references = []
    for backend in args.backend:
        model = load_model(args.model, backend=backend, progress=False, max_context=256)
        tokenizer = tokenizer or Tokenizer(model.metadata)
        print(f"pxvm {model.device_name}")
        for i, prompt in enumerate(PROMPTS):
            ids = tokenizer.encode(prompt)
            if len(references) <= i:
                with torch.no_grad():
                    out = hf.generate(torch.tensor([ids]), max_new_tokens=args.tokens,
                                      min_new_tokens=args.tokens, do_sample=False)
                    logits = hf(out[:, : len(ids)]).logits[0].double().numpy()
                references.append((logits, out[0, len(ids):].tolist()))
            hf_logits, hf_tokens = references[i]
            model.reset()
            mine = model.forward_all(ids)
            first = int(np.argmax(mine[-1]))
            tokens = [first, *model.decode(first, args.tokens - 1)]
            error = float(np.mean((mine - hf_logits) ** 2) / np.mean(hf_logits ** 2))
            print(f"  {prompt!r}: prompt logits NMSE {error:.1e}, "
                  f"{'the same' if tokens == hf_tokens else 'DIFFERENT'} greedy tokens")
            print(f"    transformers: {tokenizer.decode(hf_tokens)!r}")
            print(f"    pxvm:         {tokenizer.decode(tokens)!r}")


if __name__ == "__main__":
    main()
