"""pxvm's language models: prefill and decode tokens/s for models x backends x context
depths, measured as llama-bench's pp and tg tests (pxvm.llm.generate.benchmark: prefill
is one forward of --prompt-tokens tokens, decode --gen-tokens greedy steps, each from a
context already holding --depth tokens; medians of --repeats runs after one warm-up).
The peer is benchmarks/peers/llama_cpp.sh on the same files, in the same call.

    python benchmarks/llm.py --models smol.gguf 1b.gguf --backends cuda webgpu \\
        --depths 0 512 4096 [--prompt-tokens 512] [--gen-tokens 128] [--repeats 3] \\
        [--json results.json]

Prints a markdown table (one row per model, backend and depth) and writes every run as
JSON. A model that does not fit a backend, or a backend this machine lacks, is a row
saying why, not a stop.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
from importlib import metadata
from pathlib import Path

import pxvm
from pxvm import PxvmError  # (also in trees before pxvm.core: ab.py runs old ones)
from pxvm.llm import DEFAULT_MAX_CONTEXT, load_model
from pxvm.llm.generate import benchmark
from pxvm.llm.tokenizer import Tokenizer


def _version(package: str) -> str:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return "-"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=[None],
                        help="GGUF files (default: the packaged SmolLM2)")
    parser.add_argument("--backends", nargs="+", default=["auto"])
    parser.add_argument("--depths", nargs="+", type=int, default=[0])
    parser.add_argument("--prompt-tokens", type=int, default=512)
    parser.add_argument("--gen-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--context", type=int, default=None,
                        help="KV cache positions (default: pxvm's, or enough for the deepest "
                             "run where that is more)")
    parser.add_argument("--kv-cache", default="auto", choices=("auto", "f32", "f16"),
                        help="the KV cache's type (load_model's kv_cache)")
    parser.add_argument("--json", default=None, help="write every run here")
    args = parser.parse_args(argv)

    needed = max(args.depths) + max(args.prompt_tokens, args.gen_tokens)
    context = args.context or (needed if needed > DEFAULT_MAX_CONTEXT else None)
    rows, results = [], []
    for path in args.models:
        name = Path(path).name if path else "SmolLM2-135M (packaged)"
        for backend in args.backends:
            try:
                # benchmark()'s own warm-up run compiles what the runs use
                model = load_model(path, backend=backend, progress=False, max_context=context,
                                   kv_cache=args.kv_cache)
            except PxvmError as exc:
                rows.append(f"| {name} | {backend} | - | - | - | {exc} |")
                continue
            tokenizer = Tokenizer(model.metadata)
            for depth in args.depths:
                r = benchmark(model, tokenizer, args.prompt_tokens, args.gen_tokens,
                              args.repeats, depth=depth)
                r["model"] = name
                results.append(r)
                rows.append(f"| {name} | {r['backend']} | {depth} "
                            f"| {r['prefill_tokens_per_s']:,.0f} "
                            f"| {r['decode_tokens_per_s']:,.1f} | {r['device']} |")
                print(rows[-1], file=sys.stderr, flush=True)
            del model
    print(f"pxvm {pxvm.__version__} ({Path(pxvm.__file__).parent}), Python {platform.python_version()}, "
          f"numpy {_version('numpy')}, wgpu {_version('wgpu')}, "
          f"cuda-bindings {_version('cuda-bindings')}")
    print(f"| model | backend | depth | prefill tok/s (pp{args.prompt_tokens}) "
          f"| decode tok/s (tg{args.gen_tokens}) | device |")
    print("|---|---|---:|---:|---:|---|")
    print("\n".join(rows))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
