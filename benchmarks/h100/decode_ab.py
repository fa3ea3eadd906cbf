"""CUDA decoding at depth 0 and 512 under variants of module constants, alternating in
one process (kernels and the decoding graphs built again for each), two rounds:
`name:module.CONST=value,..`, modules the keys of MODULES, values as the constant's type
(a variant without settings: the code as it is).
Usage: python decode_ab.py MODEL.gguf VARIANT [VARIANT ..]
e.g. base late:transformer.CUDA_DECODE_EARLY=none,quantized.SMALL_PREFETCH=none"""
import importlib
import sys

from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model
from pxvm.llm.tokenizer import Tokenizer
from variants import Variants

MODULES = {"transformer": "pxvm.ops.transformer", "quantized": "pxvm.ops.quantized",
           "decode": "pxvm.llm.decode", "model": "pxvm.llm.model",
           "ptx_transformer": "pxvm.kernels.ptx.transformer"}
cuda_backend = importlib.import_module("pxvm.backends.cuda")
model = load_model(sys.argv[1], backend="cuda", progress=False)
tokenizer = Tokenizer(model.metadata)
variants = Variants(MODULES)


def apply(spec: str) -> str:
    """The variant's constants set, its kernels and decoding graphs built anew."""
    name = variants.apply(spec)
    cuda_backend._ptx.cache_clear()
    model.backend._kernels.clear()
    model.decoder.forget()
    return name


for round_ in range(2):
    for spec in sys.argv[2:]:
        line = [f"round {round_ + 1} {apply(spec)}:"]
        for depth in (0, 512):
            model.decoder.forget()
            result = benchmark(model, tokenizer, prompt_tokens=8, gen_tokens=128, repeats=3,
                               depth=depth)
            line.append(f"d{depth} {result['decode_tokens_per_s']:.1f} tok/s;")
        print(" ".join(line), flush=True)
apply("")
