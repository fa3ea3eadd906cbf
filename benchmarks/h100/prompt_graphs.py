"""Prefill with prompts replayed as graphs (pxvm.llm.prompts) and recorded anew, on one
model (same weights, same derived forms), at depth 0 and 512, alternating in one process.
Usage: python prompt_graphs.py MODEL.gguf [BACKEND] (default cuda; on another backend the
graphs are switched on here)."""
import sys

from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model
from pxvm.llm.prompts import PromptGraphs
from pxvm.llm.tokenizer import Tokenizer

name = sys.argv[2] if len(sys.argv) > 2 else "cuda"
model = load_model(sys.argv[1], backend=name, progress=False)
tokenizer = Tokenizer(model.metadata)
for round_ in range(2):
    for graphs in (True, False):
        model.prompt_graphs = PromptGraphs(model) if graphs else None
        line = [f"{name} round {round_ + 1} graphs {graphs}:"]
        for depth in (0, 512):
            result = benchmark(model, tokenizer, prompt_tokens=512, gen_tokens=8, repeats=5,
                               depth=depth)
            line.append(f"pp512 d{depth} {result['prefill_tokens_per_s']:,.0f} tok/s;")
        print(" ".join(line), flush=True)
