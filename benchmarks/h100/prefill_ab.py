"""Prefill on one backend (WebGPU by default) with module constants varied, alternating
in one process, two rounds: for each variant the speed of a 512-token prompt at depths 0
and 512 (as `pxvm bench llm` times it: model.forward, medians of 5 after a warm-up),
then that forward from an empty context split into the host's recording and its GPU
time (timestamps around one submit), and at the end, for the first variant, every
dispatch of it timed alone and summed per kernel.
Usage: python prefill_ab.py MODEL.gguf [--backend NAME] [VARIANT ..], a variant being
`name:module.CONST=value,..` (variants.py; modules: the keys of MODULES), e.g.
`rows16:quantized.TILED_MIN_ROWS=16`; a variant whose name starts with `graphs` also
replays prompts as captured graphs (pxvm.llm.prompts) whatever the backend's default."""
import statistics
import sys
import time

import numpy as np
from variants import Variants

from pxvm.batch import Batch
from pxvm.llm.model import load_model
from pxvm.llm.prompts import PromptGraphs

MODULES = {"transformer": "pxvm.ops.transformer", "model": "pxvm.llm.model",
           "quantized": "pxvm.ops.quantized", "matmul": "pxvm.ops.matmul",
           "tuning": "pxvm.ops.tuning"}
ROUNDS = 2
TOKENS = 512

args = sys.argv[1:]
backend = "webgpu"
if "--backend" in args:
    i = args.index("--backend")
    backend = args[i + 1]
    del args[i:i + 2]
path, specs = args[0], args[1:] or ["base"]
model = load_model(path, backend=backend, progress=False)
rng = np.random.default_rng(0)
ids = rng.integers(0, model.config.vocab_size, TOKENS).astype(np.int32)
context = rng.integers(0, model.config.vocab_size, 512).astype(np.int32)
variants = Variants(MODULES)
default_graphs = model.prompt_graphs


def apply(spec: str) -> str:
    name = variants.apply(spec)
    model.prompt_graphs = PromptGraphs(model) if name.startswith("graphs") else default_graphs
    return name


def prefill_seconds(depth: int) -> float:
    """Median wall time of forward(ids) after `depth` tokens (5 runs after one)."""
    runs = []
    for run in range(6):
        model.reset()
        if depth:
            model.forward(context[:depth])
        t = time.perf_counter()
        model.forward(ids)
        if run:
            runs.append(time.perf_counter() - t)
    return statistics.median(runs)


def record(batch):
    """The forward's work from an empty context recorded into `batch` (one submit)."""
    state = batch.upload(np.array([ids[-1], 0], np.int32))
    return model.transformer(batch.upload(ids), state, max_keys=TOKENS, last_only=True)


def split_seconds() -> tuple[float, float]:
    """(host recording, GPU time) of the forward as one timed submit, medians of 3."""
    host, gpu = [], []
    for _ in range(4):
        model.reset()
        t = time.perf_counter()
        with Batch(model.backend, timestamps=True) as batch:
            logits = record(batch)
        host.append(time.perf_counter() - t)
        batch.execute()
        batch.read(logits)
        gpu.append(batch.gpu_seconds or float("nan"))
    return statistics.median(host[1:]), statistics.median(gpu[1:])


print(f"{model.device_name}; {TOKENS}-token prompts on {model.backend_name}", flush=True)
for round_ in range(ROUNDS):
    for spec in specs:
        name = apply(spec)
        d0, d512 = prefill_seconds(0), prefill_seconds(512)
        host, gpu = split_seconds()
        print(f"round {round_} {name:>14}: pp{TOKENS} {TOKENS / d0:9,.1f} tok/s, "
              f"at depth 512 {TOKENS / d512:9,.1f}; one submit: host {host * 1e3:6.2f} ms, "
              f"GPU {gpu * 1e3:6.2f} ms", flush=True)
apply(specs[0])
model.reset()
with Batch(model.backend, profile=True) as batch:
    record(batch)
batch.execute()
by_kernel: dict[str, list[float]] = {}
for label, seconds in batch.profile or []:
    by_kernel.setdefault(label, []).append(seconds)
print(f"{specs[0]}: {len(batch.profile or [])} dispatches, each timed alone:")
for label, spans in sorted(by_kernel.items(), key=lambda kv: -sum(kv[1])):
    print(f"  {label}: {sum(spans) * 1e3:.2f} ms ({len(spans)})")
