"""Where a 512-token prefill's time goes: the forward's wall time, the host's recording
against the GPU's time (timestamps around the batch), then every dispatch of the same
forward timed alone (one pass each), summed per kernel.
Usage: python prefill_profile.py MODEL.gguf [BACKEND] (webgpu by default; or through
explore_decode.sh)."""
import sys
import time

import numpy as np

from pxvm.batch import Batch
from pxvm.llm.model import load_model

model = load_model(sys.argv[1], backend=sys.argv[2] if len(sys.argv) > 2 else "webgpu",
                   progress=False)
ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 512).astype(np.int32)


def record(batch):
    """The forward's work from an empty context recorded into `batch`, as one submit
    (forward() submits a long prompt layer by layer); returns the last token's logits."""
    state = batch.upload(np.array([ids[-1], 0], np.int32))
    return model.transformer(batch.upload(ids), state, max_keys=len(ids), last_only=True)


for _ in range(2):  # the first compiles the pipelines
    model.reset()
    t = time.perf_counter()
    model.forward(ids)
    print(f"prefill of 512 tokens: {time.perf_counter() - t:.4f} s")
# the same forward split: the host recording its batch, then its GPU time (timestamps)
for _ in range(3):
    model.reset()
    t = time.perf_counter()
    with Batch(model.backend, timestamps=True) as batch:
        logits = record(batch)
    recorded = time.perf_counter() - t
    batch.execute()
    batch.read(logits)
    total = time.perf_counter() - t
    print(f"host recording {recorded * 1e3:.1f} ms, GPU {batch.gpu_seconds * 1e3:.1f} ms, "
          f"whole {total * 1e3:.1f} ms")
model.reset()
with Batch(model.backend, profile=True) as batch:
    record(batch)
batch.execute()
by_kernel: dict[str, float] = {}
for label, seconds in batch.profile or []:
    by_kernel[label] = by_kernel.get(label, 0.0) + seconds
print(f"{len(batch.profile or [])} dispatches, each timed alone:")
for label, seconds in sorted(by_kernel.items(), key=lambda kv: -kv[1]):
    print(f"  {label}: {seconds * 1e3:.2f} ms")
