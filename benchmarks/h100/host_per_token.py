"""Where the host's time per decoded token goes, and whether several decoding steps per
command buffer (one submit and one readback per K tokens) decode faster than one step
per submit. Greedy steps chain on the GPU through the state tensor, so K copies of the
recorded step in one pass decode K tokens (benchmarks/h100/README.md)."""
import statistics
import sys
import time
from collections import deque

import numpy as np

from pxvm.llm.model import load_model
from pxvm.runtime.device import DispatchList

m = load_model(sys.argv[1], backend="gpu", progress=False)
dev = m.backend.device
print(m.device_name, flush=True)
TOKENS = 128


def step_list():
    m.reset()
    return m._decode_step(0)._list


def phases(lst: DispatchList, n=40):
    """Host microseconds of each phase of one step, the GPU drained between steps."""
    out = {k: [] for k in ("encoder", "replay", "stage", "finish", "submit", "wait", "map")}
    for _ in range(n):
        m.set_state(1, 0)
        t0 = time.perf_counter()
        rec = dev.recorder()
        t1 = time.perf_counter()
        rec.replay(lst.items, lst.native)
        t2 = time.perf_counter()
        staged = rec.stage(m.state.storage)
        t3 = time.perf_counter()
        rec._close_pass()
        cb = rec.encoder.finish()
        t4 = time.perf_counter()
        staged.submission = dev.submit(cb)
        t5 = time.perf_counter()
        dev.wait_for(staged.submission)
        t6 = time.perf_counter()
        staged._staging.map_sync(dev.wgpu.MapMode.READ)
        staged._finish(np.int32, 2)
        t7 = time.perf_counter()
        for k, a, b in zip(out, (t0, t1, t2, t3, t4, t5, t6), (t1, t2, t3, t4, t5, t6, t7)):
            out[k].append((b - a) * 1e6)
    return {k: round(statistics.median(v[5:]), 1) for k, v in out.items()}


def decode(lst: DispatchList, k: int, in_flight: int, read_every=True) -> float:
    """Tokens/s of TOKENS greedy tokens, k steps per submit, `in_flight` submits queued."""
    multi = DispatchList(dev, lst.items * k, [lst])
    m.set_state(1, 0)
    pending: deque = deque()
    t0 = time.perf_counter()
    for i in range(TOKENS // k):
        last = i == TOKENS // k - 1
        pending.append(multi.submit([m.state.storage] if (read_every or last) else []))
        while pending and (len(pending) > in_flight or last):
            rec = pending.popleft()
            for st in rec.staged:
                st.result(np.int32, 2)
    return TOKENS / (time.perf_counter() - t0)


def gpu_us_per_token(lst: DispatchList, k: int, reps=9) -> float:
    multi = DispatchList(dev, lst.items * k, [lst])
    spans = []
    for _ in range(reps):
        m.set_state(1, 0)
        rec = multi.submit([], timestamps=True)
        spans.append(rec.gpu_seconds * 1e6 / k)
    return round(statistics.median(spans[2:]), 1)


def report(lst, label, variants):
    pooled = sum(len(v) for v in dev.pool._free.values())
    print(f"== {label} ({pooled} pooled buffers)")
    print("host phases (us), drained GPU:", phases(lst))
    results = {v[0]: [] for v in variants}
    for _ in range(2):
        decode(lst, 1, 4)  # warm-up
    for _ in range(5):  # interleaved rounds
        for name, k, flight, every in variants:
            results[name].append(decode(lst, k, flight, every))
    for name, runs in results.items():
        print(f"{name}: {statistics.median(runs):.1f} tokens/s (runs {[round(r) for r in runs]})")


lst = step_list()
print("dispatches per step:", len(lst))
for k in (1, 2, 4, 8):
    print(f"GPU us per token, {k} steps in one pass:", gpu_us_per_token(lst, k))
report(lst, "fresh model", [
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
report(lst, "after a 512-token prefill", [
    ("1 step/submit, 4 in flight", 1, 4, True),
    ("4 steps/submit, 2 in flight", 4, 2, True)])
dev.pool.clear()
report(lst, "after the prefill, pool cleared", [
    ("1 step/submit, 4 in flight", 1, 4, True),
    ("4 steps/submit, 2 in flight", 4, 2, True)])
