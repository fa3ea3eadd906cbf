"""Decoding on CUDA with the graph's programmatic dependent launches on and off, and with
the cached attention's key ranges (most keys in one range, keys a range, most ranges)
and the elements of a key its dot product reads a trip changed, alternating the
configurations in one process; then where a 512-token prefill's time goes on CUDA: the
host recording it, the GPU running the same forward captured as one graph, and the
host's profile (cProfile) of one forward.
Usage: python decode_variants.py MODEL.gguf
[NAME=PDL,ONE_RANGE_KEYS,RANGE_KEYS,MAX_RANGES[,LARGEST_KEY_VEC] ...]
(default: the shipped configuration, PDL off, and two range shapes)."""
import cProfile
import importlib
import pstats
import sys
import time

import numpy as np

from pxvm.batch import Batch, Graph
from pxvm.llm.generate import benchmark
from pxvm.llm.model import load_model
from pxvm.llm.tokenizer import Tokenizer

cuda_backend = importlib.import_module("pxvm.backends.cuda")
ptx_attention = importlib.import_module("pxvm.kernels.ptx.transformer")
shipped_vecs = ptx_attention.VECS
attention = importlib.import_module("pxvm.ops.transformer")  # the module, not the op

model = load_model(sys.argv[1], backend="cuda", progress=False)
tokenizer = Tokenizer(model.metadata)
shipped = (cuda_backend.GRAPH_DEPENDENT_LAUNCHES, attention.CUDA_ONE_RANGE_KEYS,
           attention.CUDA_RANGE_KEYS, attention.CUDA_MAX_RANGES)
configs = dict(arg.split("=") for arg in sys.argv[2:]) or {
    "shipped": ",".join(str(int(v)) for v in shipped),
    "no-pdl": ",".join(str(int(v)) for v in (False, *shipped[1:]))}
for round_ in range(2):
    for name, config in configs.items():
        pdl, *ranges = (int(v) for v in config.split(","))
        cuda_backend.GRAPH_DEPENDENT_LAUNCHES = bool(pdl)
        largest_vec = ranges.pop() if len(ranges) == 4 else shipped_vecs[0]
        ptx_attention.VECS = tuple(v for v in shipped_vecs if v <= largest_vec)
        (attention.CUDA_ONE_RANGE_KEYS, attention.CUDA_RANGE_KEYS,
         attention.CUDA_MAX_RANGES) = ranges
        line = [f"round {round_ + 1} {name} ({config}):"]
        for depth in (0, 512):
            model.decoder.forget()  # the steps are recorded again with these settings
            result = benchmark(model, tokenizer, prompt_tokens=8, gen_tokens=128, repeats=3,
                               depth=depth)
            step = model.decoder.profile(repeats=5)["gpu_step_ms"]
            line.append(f"d{depth} {result['decode_tokens_per_s']:.1f} tok/s step {step} ms;")
        print(" ".join(line), flush=True)
cuda_backend.GRAPH_DEPENDENT_LAUNCHES = shipped[0]
ptx_attention.VECS = shipped_vecs
(attention.CUDA_ONE_RANGE_KEYS, attention.CUDA_RANGE_KEYS,
 attention.CUDA_MAX_RANGES) = shipped[1:]

ids = np.random.default_rng(0).integers(0, model.config.vocab_size, 512).astype(np.int32)


def record(batch):
    state = batch.upload(np.array([ids[-1], 0], np.int32))
    return model.transformer(batch.upload(ids), state, max_keys=len(ids), last_only=True)


for _ in range(3):
    model.reset()
    t = time.perf_counter()
    model.forward(ids)
    print(f"prefill of 512 tokens: {(time.perf_counter() - t) * 1e3:.1f} ms", flush=True)
for _ in range(2):
    model.reset()
    t = time.perf_counter()
    with Batch(model.backend) as batch:
        record(batch)
    print(f"host recording {(time.perf_counter() - t) * 1e3:.1f} ms")
    batch.execute()
model.reset()


def record_in_graph():
    state = model.backend.from_numpy(np.array([ids[-1], 0], np.int32))
    tokens = model.backend.from_numpy(ids)
    return {"logits": model.transformer(tokens, state, max_keys=len(ids), last_only=True)}


graph = Graph(model.backend, record_in_graph)
for _ in range(3):
    launch = graph.launch("logits", timestamps=True)
    launch.result()
    print(f"prefill as one graph: {graph.dispatches} launches, GPU "
          f"{launch.gpu_seconds * 1e3:.2f} ms", flush=True)
model.reset()
profiler = cProfile.Profile()
profiler.enable()
model.forward(ids)
profiler.disable()
pstats.Stats(profiler).sort_stats("tottime").print_stats(25)
