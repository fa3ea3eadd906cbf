"""The A/B harness: one benchmark command run alternately against two source trees, so
that both see the same machine state, and the median of each side with their ratio.

    python benchmarks/ab.py A_SRC B_SRC --rounds 3 -- python benchmarks/llm.py \\
        --models /tmp/models/smol.gguf --backends cuda webgpu --json {json}

A_SRC and B_SRC are folders holding a `pxvm` package (a checkout's src/, or one made by
`git archive REV src | tar x -C /tmp/before`); each run gets that folder first on
PYTHONPATH. `{json}` in the command is replaced by a file per run, which must hold a
list of results with `prefill_tokens_per_s` and `decode_tokens_per_s` (benchmarks/llm.py
writes them); rows are matched by model, backend and depth. To compare two `pxvm tune`
choices instead, run the same tree twice with PXVM_CACHE_DIR pointing at two tuning
folders (`--env-a`, `--env-b`).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

MEASURES = ("prefill_tokens_per_s", "decode_tokens_per_s")


def _run(src: str, command: list[str], env_extra: dict, out: Path) -> list[dict]:
    env = dict(os.environ, **env_extra)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (src, env.get("PYTHONPATH", "")) if p)
    args = [a.replace("{json}", str(out)) for a in command]
    subprocess.run(args, env=env, check=True, stdout=subprocess.DEVNULL)
    return json.loads(out.read_text())


def _pairs(values: list[str]) -> dict:
    return dict(v.split("=", 1) for v in values)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("a_src")
    parser.add_argument("b_src")
    parser.add_argument("--rounds", type=int, default=3, help="runs of each side, alternating")
    parser.add_argument("--env-a", nargs="*", default=[], help="NAME=VALUE for side A's runs")
    parser.add_argument("--env-b", nargs="*", default=[], help="NAME=VALUE for side B's runs")
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    args = parser.parse_args(argv[:split])
    command = argv[split + 1:]
    if not command or not any("{json}" in a for a in command):
        parser.error("give the benchmark command after --, with {json} where it writes results")
    sides = {"A": (args.a_src, _pairs(args.env_a)), "B": (args.b_src, _pairs(args.env_b))}
    found: dict[tuple, dict[str, list[float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for side, (src, env) in sides.items():
                out = Path(tmp) / f"{side}{round_}.json"
                for r in _run(src, command, env, out):
                    key = (r.get("model", "-"), r["backend"], r.get("depth", 0))
                    for m in MEASURES:
                        found.setdefault(key, {}).setdefault(f"{side} {m}", []).append(r[m])
                print(f"round {round_ + 1}/{args.rounds}: {side} done", file=sys.stderr)
    print(f"A: {args.a_src}  B: {args.b_src}  ({args.rounds} alternating rounds, medians)")
    print("| model | backend | depth | prefill A | prefill B | B/A | decode A | decode B | B/A |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (model, backend, depth), runs in found.items():
        cells = []
        for m in MEASURES:
            a, b = (statistics.median(runs[f"{s} {m}"]) for s in "AB")
            cells += [f"{a:,.1f}", f"{b:,.1f}", f"{b / a:.3f}"]
        print(f"| {model} | {backend} | {depth} | " + " | ".join(cells) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
