"""Is greedy decoding held back by the GPU or by the host? On a model, from an empty
context, 128 tokens: decode_greedy's speed (readbacks through wgpu-native's own map
calls or through wgpu-py's map_sync; steps per submit and submits in flight varied), the
GPU's speed on its own (every submit encoded first, then submitted back to back, with
4 to 32 steps each), the host's time to encode one step, decoding at temperature 0.7
(drawn on the device), and forward() one token at a time (the host sampler's path, for
top-k, top-p or a repetition penalty), with each way of mapping. Medians of 5 after a
warm-up, variants alternating (benchmarks/h100/README.md)."""
import statistics
import sys
import time
from types import SimpleNamespace

import pxvm.llm.model as model_module
import pxvm.runtime.device as device_module
from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model

TOKENS, RUNS = 128, 5
model = load_model(sys.argv[1], backend="gpu", progress=False)
dev = model.backend.device
tokenizer = SimpleNamespace(vocab_size=model.config.vocab_size)
native_map = device_module._NATIVE_MAP
VARIANTS = {  # name: (native map, steps per submit, submits in flight)
    "2 steps per submit, 4 in flight": (True, 2, 4),
    "2 steps per submit, 4 in flight, wgpu-py map": (False, 2, 4),
    "4 steps per submit, 2 in flight": (True, 4, 2),
    "1 step per submit, 8 in flight": (True, 1, 8),
}
ALONE = (4, 8, 32)  # steps per submit when the GPU runs alone


def decode_rate(native, steps, in_flight):
    device_module._NATIVE_MAP = native_map if native else None
    model_module.STEPS_PER_SUBMIT, model_module.SUBMITS_IN_FLIGHT = steps, in_flight
    r = benchmark(model, tokenizer, prompt_tokens=16, gen_tokens=TOKENS, repeats=1, warmup=0)
    return r["decode_tokens_per_s"]


def sampled_rate():
    """Tokens/s of decode at temperature 0.7 (each draw made on the device), from an
    empty context, the default steps per submit."""
    device_module._NATIVE_MAP = native_map
    model_module.STEPS_PER_SUBMIT, model_module.SUBMITS_IN_FLIGHT = 2, 4
    model.reset()
    t0 = time.perf_counter()
    for _ in model.decode(1, TOKENS, 0.7, 1):
        pass
    return TOKENS / (time.perf_counter() - t0)


def forward_rate(native):
    """Tokens/s of forward() one token at a time (sampling's path: logits come back)."""
    device_module._NATIVE_MAP = native_map if native else None
    model.reset()
    t0 = time.perf_counter()
    for i in range(TOKENS):
        model.forward([(i * 7 + 1) % tokenizer.vocab_size])
    return TOKENS / (time.perf_counter() - t0)


def gpu_only(per_submit, copies=False):
    """(tokens/s with every submit encoded beforehand, host us per encoded step); with
    `copies`, each step's state is copied out as decode_greedy's readback does."""
    model.reset()
    model.set_state(1, 0)
    buffers = []
    t0 = time.perf_counter()
    for chunk in range(TOKENS // per_submit):
        rec = dev.recorder()
        staged = rec.staging(model.state.storage, per_submit) if copies else None
        for step in range(per_submit):
            lst = model._decode_step(per_submit * chunk + step)._list
            rec.replay(lst.items, lst.native)
            if copies:
                rec.copy_to_staging(model.state.storage, staged, step)
        rec._close_pass()
        buffers.append(rec.encoder.finish())
    host = (time.perf_counter() - t0) / TOKENS
    t0 = time.perf_counter()
    for cb in buffers:
        dev.submit(cb)
    dev.wait()
    return TOKENS / (time.perf_counter() - t0), host * 1e6


for v in VARIANTS.values():  # warm-up: pipelines, recorded steps
    decode_rate(*v)
gpu_only(4)
forward_rate(True)
sampled_rate()
rates = {name: [] for name in VARIANTS}
forwards = {True: [], False: []}
alone, host, alone_copies, sampled = {k: [] for k in ALONE}, [], [], []
for _ in range(RUNS):
    for name, v in VARIANTS.items():
        rates[name].append(decode_rate(*v))
    for native in forwards:
        forwards[native].append(forward_rate(native))
    for k in ALONE:
        r, h = gpu_only(k)
        alone[k].append(r)
        host.append(h)
    alone_copies.append(gpu_only(4, copies=True)[0])
    sampled.append(sampled_rate())
for name, xs in rates.items():
    print(f"decode_greedy, {name}: {statistics.median(xs):.1f} tokens/s "
          f"(runs {', '.join(f'{x:.0f}' for x in xs)})")
print(f"decode at temperature 0.7, drawn on the device: {statistics.median(sampled):.1f} "
      f"tokens/s (runs {', '.join(f'{x:.0f}' for x in sampled)})")
for native, xs in forwards.items():
    print(f"forward() per token, {'native' if native else 'wgpu-py'} map: "
          f"{statistics.median(xs):.1f} tokens/s (runs {', '.join(f'{x:.0f}' for x in xs)})")
for k, xs in alone.items():
    print(f"GPU alone (submits of {k} steps encoded first): {statistics.median(xs):.1f} "
          f"tokens/s (runs {', '.join(f'{x:.0f}' for x in xs)})")
print(f"GPU alone, 4 steps per submit with each step's state copied out: "
      f"{statistics.median(alone_copies):.1f} tokens/s "
      f"(runs {', '.join(f'{x:.0f}' for x in alone_copies)})")
print(f"host: encode + finish per step {statistics.median(host):.0f} us "
      f"(runs {', '.join(f'{x:.0f}' for x in host)})")
