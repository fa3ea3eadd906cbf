"""Is greedy decoding held back by the GPU or by the host? On a model, from an empty
context, 128 tokens: decode_greedy's speed (steps per submit and submits in flight
varied through pxvm.llm.decode's constants, and with the wgpu calls of the hot path
through wgpu-py's public API instead of wgpu-native's C functions: the same model on a
second device made with PortableCalls), the GPU's speed on its own (every submit
encoded first, then submitted back to back, with 4 to 32 steps each), the host's time
to encode one step, decoding at temperature 0.7 (drawn on the device), and forward()
one token at a time (the host sampler's path, for top-k, top-p or a repetition
penalty), with each kind of calls. Medians of 5 after a warm-up, variants alternating
(benchmarks/h100/README.md)."""
import statistics
import sys
import time
from types import SimpleNamespace

import pxvm.llm.decode as decode_module
from pxvm.backends import WebGPUBackend
from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model
from pxvm.runtime.webgpu import Device, PortableCalls

TOKENS, RUNS = 128, 5
model = load_model(sys.argv[1], backend="webgpu", progress=False)
dev = model.backend.device
# the same model on a device whose hot-path calls are wgpu-py's public API
portable = load_model(sys.argv[1], backend=WebGPUBackend(Device(calls=PortableCalls())),
                      progress=False)
CALLS = {model: dev.calls.name, portable: portable.backend.device.calls.name}
tokenizer = SimpleNamespace(vocab_size=model.config.vocab_size)
DEFAULTS = decode_module.STEPS_PER_SUBMIT, decode_module.SUBMITS_IN_FLIGHT
VARIANTS = {  # name: (model, steps per submit, submits in flight)
    f"{DEFAULTS[0]} steps per submit, {DEFAULTS[1]} in flight": (model, *DEFAULTS),
    f"{DEFAULTS[0]} steps per submit, {DEFAULTS[1]} in flight, {CALLS[portable]} calls":
        (portable, *DEFAULTS),
    "4 steps per submit, 2 in flight": (model, 4, 2),
    "1 step per submit, 8 in flight": (model, 1, 8),
}
ALONE = (4, 8, 32)  # steps per submit when the GPU runs alone


def decode_rate(on, steps, in_flight):
    decode_module.STEPS_PER_SUBMIT, decode_module.SUBMITS_IN_FLIGHT = steps, in_flight
    r = benchmark(on, tokenizer, prompt_tokens=16, gen_tokens=TOKENS, repeats=1, warmup=0)
    return r["decode_tokens_per_s"]


def sampled_rate():
    """Tokens/s of decode at temperature 0.7 (each draw made on the device), from an
    empty context, the default steps per submit."""
    decode_module.STEPS_PER_SUBMIT, decode_module.SUBMITS_IN_FLIGHT = DEFAULTS
    model.reset()
    t0 = time.perf_counter()
    for _ in model.decode(1, TOKENS, 0.7, 1):
        pass
    return TOKENS / (time.perf_counter() - t0)


def forward_rate(on):
    """Tokens/s of forward() one token at a time (sampling's path: logits come back)."""
    on.reset()
    t0 = time.perf_counter()
    for i in range(TOKENS):
        on.forward([(i * 7 + 1) % tokenizer.vocab_size])
    return TOKENS / (time.perf_counter() - t0)


def gpu_only(per_submit, copies=False):
    """(tokens/s with every submit encoded beforehand, host us per encoded step); with
    `copies`, each step's state is copied out (a readback per step, which splits the
    pass; decoding copies once per submit)."""
    model.reset()
    model.decoder.set_state(1, 0)
    names = ("state",) if copies else ()
    t0 = time.perf_counter()
    prepared = [model.decoder.step(first).prepare(*names, runs=per_submit, each_run=copies)
                for first in range(0, TOKENS, per_submit)]
    host = (time.perf_counter() - t0) / TOKENS
    t0 = time.perf_counter()
    launches = [p.submit() for p in prepared]
    dev.wait()
    rate = TOKENS / (time.perf_counter() - t0)
    for launch in launches:  # hands the readback buffers back to the pool
        launch.result()
    return rate, host * 1e6


for v in VARIANTS.values():  # warm-up: pipelines, recorded steps
    decode_rate(*v)
gpu_only(4)
for m in CALLS:
    forward_rate(m)
sampled_rate()
rates = {name: [] for name in VARIANTS}
forwards = {m: [] for m in CALLS}
alone, host, alone_copies, sampled = {k: [] for k in ALONE}, [], [], []
for _ in range(RUNS):
    for name, v in VARIANTS.items():
        rates[name].append(decode_rate(*v))
    for m in forwards:
        forwards[m].append(forward_rate(m))
    for k in ALONE:
        r, h = gpu_only(k)
        alone[k].append(r)
        host.append(h)
    alone_copies.append(gpu_only(4, copies=True)[0])
    sampled.append(sampled_rate())
decode_module.STEPS_PER_SUBMIT, decode_module.SUBMITS_IN_FLIGHT = DEFAULTS
for name, xs in rates.items():
    print(f"decode_greedy, {name}: {statistics.median(xs):.1f} tokens/s "
          f"(runs {', '.join(f'{x:.0f}' for x in xs)})")
print(f"decode at temperature 0.7, drawn on the device: {statistics.median(sampled):.1f} "
      f"tokens/s (runs {', '.join(f'{x:.0f}' for x in sampled)})")
for m, xs in forwards.items():
    print(f"forward() per token, {CALLS[m]} calls: "
          f"{statistics.median(xs):.1f} tokens/s (runs {', '.join(f'{x:.0f}' for x in xs)})")
for k, xs in alone.items():
    print(f"GPU alone (submits of {k} steps encoded first): {statistics.median(xs):.1f} "
          f"tokens/s (runs {', '.join(f'{x:.0f}' for x in xs)})")
print(f"GPU alone, 4 steps per submit with each step's state copied out: "
      f"{statistics.median(alone_copies):.1f} tokens/s "
      f"(runs {', '.join(f'{x:.0f}' for x in alone_copies)})")
print(f"host: encode + finish per step {statistics.median(host):.0f} us "
      f"(runs {', '.join(f'{x:.0f}' for x in host)})")
