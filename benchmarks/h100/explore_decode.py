"""Decode and prefill speed of a GGUF on the GPU for several lanes-per-column and
steps-per-submit settings, then the decode profile (benchmarks/h100/README.md)."""
import json
import statistics
import sys
import time

import numpy as np

import pxvm.llm.model as model_module
import pxvm.ops.quantized as quantized
from pxvm.batch import Batch
from pxvm.llm.model import load_model, profile_decode_step, step_bound

m = load_model(sys.argv[1], backend="gpu", progress=False)
print(m.device_name, sorted(m.backend.device.features), flush=True)
ids = np.random.default_rng(0).integers(0, m.config.vocab_size, 512).tolist()


def run(label, repeats=3):
    m._steps.clear()  # record the steps again with the current settings
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


default_lanes = quantized._lanes
first = None
for lanes in (32, 16, 8):
    quantized._lanes = lambda ctx, requested, m, n, k, v=lanes: v
    tokens = run(f"lanes {lanes}")
    first = first or tokens
    print("  same tokens as the first setting:", tokens == first)
quantized._lanes = default_lanes
default_runs = model_module.STEPS_PER_SUBMIT
for runs in (1, 4, 8):
    model_module.STEPS_PER_SUBMIT = runs
    tokens = run(f"steps per submit {runs}")
    print("  same tokens as the first setting:", tokens == first)
model_module.STEPS_PER_SUBMIT = default_runs
m._steps.clear()
m.reset()
m.forward(ids)
print(json.dumps(profile_decode_step(m, 20), indent=1))
m.set_state(1, m.position)
b = Batch(m.backend, profile=True)
m.record_step(b, max_keys=step_bound(m.position, m.context_length))
b.execute()
print("first layer:", [(label.split(":")[1], round(s * 1e6, 1)) for label, s in b.profile[:8]])
print("last:", [(label.split(":")[1], round(s * 1e6, 1)) for label, s in b.profile[-5:]])
