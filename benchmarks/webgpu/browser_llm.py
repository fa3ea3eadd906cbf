"""The browser page's language model against pxvm's native WebGPU on the same adapter:
prefill and decode tokens/s of a GGUF model (default SmolLM2) in headless Chromium
(static/llm.html, its worker running the plans pxvm records) and through wgpu in this
process, alternately, `--rounds` times; prints a markdown table of the medians, then each
round's (the VM's other work moves both sides' speeds between rounds, so the ratios of
one round, measured close together, say more than either side's speed).

Without a GPU both run on SwiftShader: Chromium's own (its WebGPU through Dawn on
SwiftShader's Vulkan), and native wgpu on the same SwiftShader build through its Vulkan
ICD (VK_ICD_FILENAMES=/usr/lib/chromium/vk_swiftshader_icd.json, PXVM_DEVICE=0); the
script sets both when the ICD exists and VK_ICD_FILENAMES is unset. Extra Chromium
flags (e.g. --enable-dawn-features=disable_robustness) go in --chromium-arg.

    PYTHONPATH=src python benchmarks/webgpu/browser_llm.py --tokens 16 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

ICD = "/usr/lib/chromium/vk_swiftshader_icd.json"
if os.path.exists(ICD) and "VK_ICD_FILENAMES" not in os.environ:  # before wgpu loads
    os.environ["VK_ICD_FILENAMES"] = ICD
    os.environ.setdefault("PXVM_DEVICE", "0")

import numpy as np  # noqa: E402

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "tests", "web"))
from test_page import CHROMIUM, CHROMIUM_ARGS  # noqa: E402

from pxvm.llm import load_model  # noqa: E402
from pxvm.llm.generate import encode_text  # noqa: E402
from pxvm.llm.tokenizer import Tokenizer  # noqa: E402
from pxvm.serve.page import Page  # noqa: E402
from pxvm.serve.server import HttpServer  # noqa: E402
from pxvm.web.llm_plans import BROWSER_CONTEXT  # noqa: E402

QUESTION = "What is the capital of France? Answer in one sentence, then explain why."


def native_round(model, ids, tokens):
    model.reset()
    t0 = time.perf_counter()
    logits = model.forward(ids)
    t1 = time.perf_counter()
    first = int(np.argmax(logits))
    out = [first, *model.decode_greedy(first, tokens - 1)]
    t2 = time.perf_counter()
    return out, t1 - t0, t2 - t1


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF file (default: SmolLM2)")
    ap.add_argument("--tokens", type=int, default=16, help="tokens generated a round")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--chromium-arg", action="append", default=[])
    args = ap.parse_args()
    from playwright.sync_api import sync_playwright

    model = load_model(args.model, backend="webgpu", progress=False, max_context=BROWSER_CONTEXT)
    ids = encode_text(Tokenizer(model.metadata), model.metadata,
                      messages=[{"role": "user", "content": QUESTION}])
    native_round(model, ids, 2)  # compile and record first
    srv = HttpServer(None, page=Page(llm_model=args.model)).start()
    page_times, native_times = [], []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=CHROMIUM_ARGS + args.chromium_arg)
            page = browser.new_page()
            page.goto(srv.url + "/static/llm.html")
            page.wait_for_selector("body[data-ready]", timeout=60_000)
            adapter = page.inner_text("#llm-gpu")
            page.evaluate("() => window.pxvmLlm.loadServer()")
            page.evaluate("([ids, n]) => window.pxvmLlm.generate(ids, n)", [ids, 2])  # warm-up
            for _ in range(args.rounds):
                got = page.evaluate("([ids, n]) => window.pxvmLlm.generate(ids, n)", [ids, args.tokens])
                page_times.append((got["prefillSeconds"], got["decodeSeconds"]))
                native, prefill, decode = native_round(model, ids, args.tokens)
                native_times.append((prefill, decode))
                if native != got["tokens"]:
                    print(f"tokens differ: page {got['tokens']}, native {native}", file=sys.stderr)
            browser.close()
    finally:
        srv.stop()
    rate = lambda n, times, k: n / statistics.median(t[k] for t in times)  # noqa: E731
    rows = [("prefill", len(ids), 0), ("decode", args.tokens - 1, 1)]
    print(f"page: {adapter}; native: {model.device_name}; prompt {len(ids)} tokens, "
          f"{args.tokens} generated, {args.rounds} rounds, chromium args {args.chromium_arg}\n")
    print("| test | page tokens/s | native tokens/s | page / native |")
    print("|---|---|---|---|")
    for name, n, k in rows:
        a, b = rate(n, page_times, k), rate(n, native_times, k)
        print(f"| {name} ({n} tokens) | {a:.2f} | {b:.2f} | {a / b:.2f}x |")
    print("\n| round | prefill page / native tokens/s | ratio | decode page / native tokens/s | ratio |")
    print("|---|---|---|---|---|")
    for i, (page_t, native_t) in enumerate(zip(page_times, native_times), 1):
        cells = []
        for n, k in ((len(ids), 0), (args.tokens - 1, 1)):
            a, b = n / page_t[k], n / native_t[k]
            cells += [f"{a:.2f} / {b:.2f}", f"{a / b:.2f}x"]
        print(f"| {i} | {' | '.join(cells)} |")


if __name__ == "__main__":
    main()
