"""What a short generation in a fresh process sees: the time to load the model, to warm
it up (Model.warm_up) or not, then a 37-token prefill, 8 tokens sampled one forward()
at a time and 32 greedy tokens, each timed once as `pxvm generate` would.
Usage: python first_use.py MODEL.gguf warm|cold (one process per setting: compiled
pipelines live as long as the process)."""
import sys
import time

import numpy as np

from pxvm.llm.model import load_model

path, setting = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
model = load_model(path, backend="webgpu", progress=False)
t1 = time.perf_counter()
if setting == "warm":
    model.warm_up()
t2 = time.perf_counter()
ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 37).tolist()
model.reset()
logits = model.forward(ids)
t3 = time.perf_counter()
token = int(np.argmax(logits))
for _ in range(8):
    token = int(np.argmax(model.forward([token])))
t4 = time.perf_counter()
tokens = list(model.decode_greedy(token, 32))
t5 = time.perf_counter()
print(f"{setting}: load {t1 - t0:.2f} s, warm-up {t2 - t1:.2f} s, prefill 37 tokens "
      f"{37 / (t3 - t2):.1f} tokens/s, 8 forward() tokens {8 / (t4 - t3):.1f} tokens/s, "
      f"32 greedy tokens {32 / (t5 - t4):.1f} tokens/s", flush=True)
