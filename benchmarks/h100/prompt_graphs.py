"""Prefill with prompts replayed as graphs (pxvm.llm.prompts) and recorded anew, on CUDA
and on WebGPU (where prompts are recorded anew unless switched on here), at depth 0 and
512, alternating in one process.
Usage: python prompt_graphs.py MODEL.gguf [BACKEND ...] (default: cuda webgpu)."""
import sys

from pxvm.backends import get_backend
from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model
from pxvm.llm.tokenizer import Tokenizer

for name in sys.argv[2:] or ["cuda", "webgpu"]:
    backend_class = type(get_backend(name))
    shipped = backend_class.prompt_graphs
    model = load_model(sys.argv[1], backend=name, progress=False)
    tokenizer = Tokenizer(model.metadata)
    for round_ in range(2):
        for graphs in (True, False):
            backend_class.prompt_graphs = graphs
            model = load_model(sys.argv[1], backend=name, progress=False)
            line = [f"{name} round {round_ + 1} graphs {graphs}:"]
            for depth in (0, 512):
                result = benchmark(model, tokenizer, prompt_tokens=512, gen_tokens=8,
                                   repeats=5, depth=depth)
                line.append(f"pp512 d{depth} {result['prefill_tokens_per_s']:,.0f} tok/s;")
            print(" ".join(line), flush=True)
    backend_class.prompt_graphs = shipped
