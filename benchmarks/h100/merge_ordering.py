"""Decoding at depth 0 and 512 with the attention ranges' merge ordered by the count's
release/acquire atomic and by fences (ptx.transformer.MERGE_ORDERING), alternating in
one process (the kernels are built again for each).
Usage: python merge_ordering.py MODEL.gguf"""
import importlib
import sys

from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model
from pxvm.llm.tokenizer import Tokenizer

ptx_transformer = importlib.import_module("pxvm.kernels.ptx.transformer")
cuda_backend = importlib.import_module("pxvm.backends.cuda")
model = load_model(sys.argv[1], backend="cuda", progress=False)
tokenizer = Tokenizer(model.metadata)
for round_ in range(2):
    for ordering in ("release/acquire", "fences"):
        ptx_transformer.MERGE_ORDERING = ordering
        cuda_backend._ptx.cache_clear()  # the attention kernels built with it
        model.backend._kernels.clear()
        line = [f"round {round_ + 1} {ordering}:"]
        for depth in (0, 512):
            model.decoder.forget()
            result = benchmark(model, tokenizer, prompt_tokens=8, gen_tokens=128, repeats=3,
                               depth=depth)
            line.append(f"d{depth} {result['decode_tokens_per_s']:.1f} tok/s;")
        print(" ".join(line), flush=True)
