"""SmolLM2's decoding on CUDA with the matrix-vector kernel's shape (outputs a block, rows
a group, prefetch) set for its types, alternating configurations in one process.
Usage: python decode_shapes.py MODEL.gguf "8,8,bulk" "4,4,bulk" ... (rounds of each)."""
import importlib
import sys

from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model
from pxvm.llm.tokenizer import Tokenizer

quantized = importlib.import_module("pxvm.ops.quantized")  # the module, not the op
model = load_model(sys.argv[1], backend="cuda", progress=False)
tokenizer = Tokenizer(model.metadata)
for round_ in range(2):
    for config in sys.argv[2:]:
        rows, group, prefetch = config.split(",")
        quantized.MATVEC_SHAPES = {t: (int(rows), int(group)) for t in (2, 3, 8, 12, 13, 14)}
        quantized.MATVEC_PREFETCH = prefetch
        model.decoder.forget()  # the steps are recorded again with these kernels
        result = benchmark(model, tokenizer, prompt_tokens=8, gen_tokens=128, repeats=3)
        step = model.decoder.profile(repeats=5)["gpu_step_ms"]
        print(f"round {round_ + 1} {config}: decode {result['decode_tokens_per_s']:.1f} "
              f"tokens/s, GPU step {step} ms", flush=True)
