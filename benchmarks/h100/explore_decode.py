"""Decode and prefill speed of a GGUF on the GPU for several lanes-per-column and
steps-per-submit settings, then the decode profile (benchmarks/h100/README.md)."""
import functools
import json
import statistics
import sys
import time

import numpy as np

import pxvm.llm.decode as decode_module
import pxvm.llm.model as model_module
import pxvm.ops.transformer as transformer
from pxvm.batch import Batch
from pxvm.llm.decode import step_bound
from pxvm.llm.model import load_model

m = load_model(sys.argv[1], backend="webgpu", progress=False)
print(m.device_name, sorted(m.backend.device.features), flush=True)
ids = np.random.default_rng(0).integers(0, m.config.vocab_size, 512).tolist()
# the model's products (prefill's and decoding's), whose `lanes` a setting forces
PRODUCTS = ("rmsnorm_matmul_quant", "rmsnorm_glu_quant", "matmul_quant_add",
            "attention_cached_matmul_quant_add")


class ForcedLanes:
    """pxvm.ops.transformer as the model sees it, with every product's `lanes` set."""

    def __init__(self, lanes):
        self.lanes = lanes

    def __getattr__(self, name):
        found = getattr(transformer, name)
        return functools.partial(found, lanes=self.lanes) if name in PRODUCTS else found


def run(label, repeats=3):
    m.decoder.forget()  # record the steps again with the current settings
    runs = []
    for _ in range(repeats + 1):
        m.reset()
        t0 = time.perf_counter()
        logits = m.forward(ids)
        t1 = time.perf_counter()
        tokens = list(m.decode_greedy(int(np.argmax(logits)), 128))
        t2 = time.perf_counter()
        runs.append((512 / (t1 - t0), 128 / (t2 - t1)))
    runs = runs[1:]
    print(f"{label}: prefill {statistics.median(r[0] for r in runs):.0f} tokens/s, "
          f"decode {statistics.median(r[1] for r in runs):.1f} tokens/s", flush=True)
    return tokens


first = None
for lanes in (32, 16, 8):
    model_module.transformer = ForcedLanes(lanes)
    tokens = run(f"lanes {lanes}")
    first = first or tokens
    print("  same tokens as the first setting:", tokens == first)
model_module.transformer = transformer
default_runs = decode_module.STEPS_PER_SUBMIT
for runs in (1, 4, 8):
    decode_module.STEPS_PER_SUBMIT = runs
    tokens = run(f"steps per submit {runs}")
    print("  same tokens as the first setting:", tokens == first)
decode_module.STEPS_PER_SUBMIT = default_runs
m.decoder.forget()
m.reset()
m.forward(ids)
print(json.dumps(m.decoder.profile(20), indent=1))
m.decoder.set_state(1, m.position)
with Batch(m.backend, profile=True) as b:
    m.record_step(m.decoder.state, m.decoder.sampler,
                  max_keys=step_bound(m.position, m.context_length))
b.execute()
print("first layer:", [(label.split(":")[1], round(s * 1e6, 1)) for label, s in b.profile[:8]])
print("last:", [(label.split(":")[1], round(s * 1e6, 1)) for label, s in b.profile[-5:]])
