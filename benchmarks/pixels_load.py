"""Loading a model from its pixel container against loading it from its GGUF file: the
median of alternating `load_model` runs, after one of each, with the load average.

    python benchmarks/pixels_load.py MODEL.gguf FOLDER --backends numpy cpu --runs 7

FOLDER is MODEL.gguf packed (`pxvm pixels pack MODEL.gguf -o FOLDER`). Each run opens
the model, checks it and uploads its weights (`load_model(path, backend,
max_context=64)`); the files are in the page cache after the first runs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from pxvm.llm import load_model


def _seconds(path: str, backend: str) -> float:
    start = time.perf_counter()
    load_model(path, backend, progress=False, max_context=64)
    return time.perf_counter() - start


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("gguf")
    parser.add_argument("folder")
    parser.add_argument("--backends", nargs="+", default=["numpy", "cpu"])
    parser.add_argument("--runs", type=int, default=7, help="runs of each, alternating")
    args = parser.parse_args(argv)
    print("| backend | from the GGUF file | from its pixels | pixels / GGUF | load average |")
    print("|---|---|---|---|---|")
    for backend in args.backends:
        _seconds(args.gguf, backend), _seconds(args.folder, backend)  # warm-up
        runs = [(_seconds(args.gguf, backend), _seconds(args.folder, backend))
                for _ in range(args.runs)]
        gguf = statistics.median(g for g, _ in runs)
        pixels = statistics.median(p for _, p in runs)
        load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
        print(f"| {backend} | {gguf:.3f} s | {pixels:.3f} s | {pixels / gguf:.2f}x | {load} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
