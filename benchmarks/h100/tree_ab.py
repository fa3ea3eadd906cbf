"""The decoding step's GPU time at several positions and greedy decoding's speed, for
the pxvm source tree first on PYTHONPATH, with module constants changed per variant:
`name:module.CONST=value,..` (modules: the keys of MODULES). Run by tree_ab.sh, which
alternates two source trees (an older commit, with its own copy of this script, against
the working tree) in separate processes; GPU times are timestamps around one pass of the
recorded step, so they compare across processes. Variants and rounds alternate within
one.
Usage: python tree_ab.py MODEL.gguf LABEL [VARIANT ..]"""
import json
import statistics
import sys
from types import SimpleNamespace

from recorded_step import RecordedStep
from variants import Variants

from pxvm.llm.generate import benchmark

POSITIONS = [0, 64, 128, 200, 255, 300, 640, 2000, 4000]
ROUNDS = 3
MODULES = {"transformer": "pxvm.ops.transformer", "model": "pxvm.llm.model",
           "decode": "pxvm.llm.decode", "quantized": "pxvm.ops.quantized",
           "tuning": "pxvm.ops.tuning"}

path, label, specs = sys.argv[1], sys.argv[2], sys.argv[3:] or ["base"]
step = RecordedStep(path, for_position=0)
model = step.model
variants = Variants(MODULES)


def apply(spec: str) -> str:
    """The variant's constants set (variants.Variants); returns its name."""
    name = variants.apply(spec)
    model.decoder.forget()  # re-recorded with the variant's constants
    return name


times = {spec: {p: [] for p in POSITIONS} for spec in specs}
for _ in range(ROUNDS):
    for spec in specs:
        apply(spec)
        for pos in POSITIONS:
            items = list(model.decoder.step(pos).captured.dispatches.items)
            times[spec][pos].append(step.time(items, pos, 21))
tokenizer = SimpleNamespace(vocab_size=model.config.vocab_size)
for spec in specs:
    name = apply(spec)
    rates = {}
    for depth in (0, 512):
        r = benchmark(model, tokenizer, prompt_tokens=512, gen_tokens=128, repeats=5,
                      depth=depth)
        rates[depth] = round(r["decode_tokens_per_s"], 1)
        rates[f"pp{depth}"] = round(r["prefill_tokens_per_s"], 1)
    step_us = {p: round(statistics.median(v), 1) for p, v in times[spec].items()}
    print(json.dumps({"tree": label, "variant": name, "step_us": step_us,
                      "decode_tok_s": {"d0": rates[0], "d512": rates[512]},
                      "prefill_tok_s": {"d0": rates["pp0"], "d512": rates["pp512"]},
                      "dispatches": model.decoder.step(640).dispatches}), flush=True)
