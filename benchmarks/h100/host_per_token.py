"""Where the host's time per decoded token goes, and whether several decoding steps per
command buffer (one submit and one readback per K tokens) decode faster than one step
per submit. Greedy steps chain on the GPU through the state tensor, so K runs of the
recorded step in one pass decode K tokens (benchmarks/h100/README.md)."""
import statistics
import sys
import time
from collections import deque

import numpy as np

from pxvm.batch import Graph
from pxvm.llm.model import load_model

m = load_model(sys.argv[1], backend="webgpu", progress=False)
dev = m.backend.device
state = m.decoder.state
print(m.device_name, f"(wgpu calls: {dev.calls.name})", flush=True)
TOKENS = 128


def recorded_step() -> Graph:
    m.reset()
    return m.decoder.step(0)


def phases(step: Graph, n=40):
    """Host microseconds of each phase of one step, the GPU drained between steps."""
    dispatches = step.captured.dispatches
    out = {k: [] for k in ("encoder", "replay", "stage", "finish", "submit", "wait", "map")}
    for _ in range(n):
        m.decoder.set_state(1, 0)
        t0 = time.perf_counter()
        rec = dev.recorder()
        t1 = time.perf_counter()
        rec.replay(dispatches)
        t2 = time.perf_counter()
        staged = rec.stage(state.storage)
        t3 = time.perf_counter()
        rec.finish()
        t4 = time.perf_counter()
        rec.submit()
        t5 = time.perf_counter()
        dev.calls.wait_for(dev.device, staged.submission)
        t6 = time.perf_counter()
        staged.result(np.int32, 2)
        t7 = time.perf_counter()
        for k, a, b in zip(out, (t0, t1, t2, t3, t4, t5, t6), (t1, t2, t3, t4, t5, t6, t7)):
            out[k].append((b - a) * 1e6)
    return {k: round(statistics.median(v[5:]), 1) for k, v in out.items()}


def decode(k: int, in_flight: int, read_every=True) -> float:
    """Tokens/s of TOKENS greedy tokens from position 0, k steps per submit (each
    submit's the step recorded for its positions, as decoding's), `in_flight` submits
    queued."""
    m.decoder.set_state(1, 0)
    pending: deque = deque()
    t0 = time.perf_counter()
    for i in range(TOKENS // k):
        last = i == TOKENS // k - 1
        names = ("state",) if (read_every or last) else ()
        pending.append(m.decoder.step(i * k).launch(*names, runs=k, each_run=False))
        while pending and (len(pending) > in_flight or last):
            pending.popleft().result()
    return TOKENS / (time.perf_counter() - t0)


def gpu_us_per_token(step: Graph, k: int, reps=9) -> float:
    spans = []
    for _ in range(reps):
        m.decoder.set_state(1, 0)
        launch = step.launch(timestamps=True, runs=k, each_run=False)
        spans.append(launch.gpu_seconds * 1e6 / k)
    return round(statistics.median(spans[2:]), 1)


def report(step, label, variants):
    print(f"== {label} ({dev.pool.kept_buffers} pooled buffers)")
    print("host phases (us), drained GPU:", phases(step))
    results = {v[0]: [] for v in variants}
    for _ in range(2):
        decode(1, 4)  # warm-up (records the steps of later positions)
    for _ in range(5):  # interleaved rounds
        for name, k, flight, every in variants:
            results[name].append(decode(k, flight, every))
    for name, runs in results.items():
        print(f"{name}: {statistics.median(runs):.1f} tokens/s (runs {[round(r) for r in runs]})")


step = recorded_step()
print("dispatches per step:", step.dispatches)
for k in (1, 2, 4, 8):
    print(f"GPU us per token, {k} steps in one pass:", gpu_us_per_token(step, k))
report(step, "fresh model", [
    ("1 step/submit, 4 in flight", 1, 4, True),
    ("1 step/submit, 4 in flight, read only the last", 1, 4, False),
    ("2 steps/submit, 2 in flight", 2, 2, True),
    ("4 steps/submit, 2 in flight", 4, 2, True),
    ("8 steps/submit, 1 in flight", 8, 1, True)])
# pxvm bench llm prefills before decoding: does what the prefill leaves behind (pooled
# buffers, wgpu's resource tables) change the host's cost of a step?
ids = np.random.default_rng(0).integers(0, m.config.vocab_size, 512).tolist()
m.reset()
m.forward(ids)
report(step, "after a 512-token prefill", [
    ("1 step/submit, 4 in flight", 1, 4, True),
    ("4 steps/submit, 2 in flight", 4, 2, True)])
dev.pool.clear()
report(step, "after the prefill, pool cleared", [
    ("1 step/submit, 4 in flight", 1, 4, True),
    ("4 steps/submit, 2 in flight", 4, 2, True)])
