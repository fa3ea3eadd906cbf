"""Benchmark: LLM prefill and decode tokens/s on each backend.

    python benchmarks/bench_llm.py [--model FILE.gguf] [--backends webgpu numpy]
                                   [--prompt-tokens 512] [--gen-tokens 128] [--depth 0]
                                   [--repeats 3]

Prefill is one forward of a `--prompt-tokens` prompt; decode is `--gen-tokens` greedy
single-token forwards; each starts from a context holding `--depth` tokens (llama-bench's
-d). Medians of the repeats after one warm-up run (the same measurement as
`pxvm bench llm`). Prints a markdown table for BENCHMARKS.md and writes
the raw results as JSON.
"""

from __future__ import annotations

import argparse
import json

from pxvm.llm import load_model
from pxvm.llm.generate import benchmark
from pxvm.llm.tokenizer import Tokenizer


def main(argv=None):
    parser = argparse.ArgumentParser(description="LLM prefill/decode tokens/s")
    parser.add_argument("--model", default=None)
    parser.add_argument("--backends", nargs="+", default=["webgpu", "numpy"])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--depth", type=int, default=0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--output", default="bench_llm.json")
    args = parser.parse_args(argv)

    results = []
    for backend in args.backends:
        model = load_model(args.model, backend=backend, progress=False)
        results.append(benchmark(model, Tokenizer(model.metadata), args.prompt_tokens,
                                 args.gen_tokens, args.repeats, depth=args.depth))
    at = f" @ depth {args.depth}" if args.depth else ""
    print(f"| backend | device | prefill tok/s ({args.prompt_tokens}{at}) "
          f"| decode tok/s ({args.gen_tokens}{at}) |")
    print("|---|---|---:|---:|")
    for r in results:
        print(f"| {r['backend']} | {r['device']} | {r['prefill_tokens_per_s']:.1f} "
              f"| {r['decode_tokens_per_s']:.1f} |")
    with open(args.output, "w", encoding="utf-8") as f:
        json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
