"""The page in a real headless Chromium: WebGPU through SwiftShader runs every listed
conformance case, the dot-test .pxi and a random program byte-identical to the CPU
executor, and the benchmarks; saves a screenshot.

Chromium flags (Debian chromium 156, no GPU): `--enable-unsafe-webgpu` is the one that
matters: without it navigator.gpu exists but requestAdapter() returns null, because the
only adapter is SwiftShader (a fallback adapter, blocklisted by default). WebGPU also
needs a secure context, hence http://127.0.0.1 (a data: URL has no navigator.gpu).
`--use-angle=swiftshader --enable-features=Vulkan` are kept for machines whose GL/Vulkan
driver would otherwise be tried first; the sandbox flags let it run as root in a
container; the rest keep the browser off the network.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = [
    "--enable-unsafe-webgpu", "--no-sandbox", "--disable-gpu-sandbox", "--use-angle=swiftshader",
    "--enable-features=Vulkan", "--disable-background-networking", "--disable-component-update",
    "--no-first-run", "--disable-sync",
]
REPO = Path(__file__).resolve().parents[2]

pytestmark = [
    pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing (apt-get install chromium)"),
    pytest.mark.skipif(importlib.util.find_spec("playwright") is None,
                       reason="playwright is missing (pip install playwright; never download its browsers)"),
]


@pytest.fixture(scope="module")
def page_url():
    from pxvm.serve.page import Page
    from pxvm.serve.server import HttpServer

    srv = HttpServer(None, page=Page()).start()
    yield srv.url + "/"
    srv.stop()


def test_page_runs_suite_programs_and_benchmarks(page_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1200, "height": 900})
            errors = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            kernels = _fetched_kernels(page)
            page.goto(page_url + "?bench=1&reps=3")
            summary = page.wait_for_selector("#suite-summary:not([data-state=running])", timeout=120_000)
            assert summary.get_attribute("data-state") == "done", summary.inner_text()
            assert page.get_attribute("#webgpu", "data-state") == "ok"
            # SwiftShader grants subgroups (4 wide): the cases' plans take the subgroup
            # variants, which the browser compiles with their `enable subgroups;`
            assert "subgroups" in page.inner_text("#plan-features")
            assert {"matmul_quant_subgroups.wgsl", "attention_cached_subgroups.wgsl"} <= kernels

            rows = page.query_selector_all("#suite-rows tr")
            assert len(rows) > 0
            # checked last, so one failing kernel still lets programs and benchmarks be tested
            failed = [r.inner_text().replace("\t", " ") for r in rows if r.get_attribute("data-state") != "pass"]

            if importlib.util.find_spec("pxvm.vm") is not None:
                page.select_option("#program-select", "random")
                page.click("#program-run")
                # a dropped file goes the upload route: the server runs the CPU executor
                from importlib import resources

                with resources.as_file(resources.files("pxvm.examples").joinpath("dot_test.pxi")) as pxi:
                    page.set_input_files("#program-file", str(pxi))
                page.wait_for_function(
                    "() => document.querySelectorAll('.program').length >= 3 && "
                    "![...document.querySelectorAll('.program')].some(c => c.dataset.state === 'running')",
                    timeout=60_000)
                cards = {c.get_attribute("data-name"): (c.get_attribute("data-state"), c.inner_text())
                         for c in page.query_selector_all(".program")}
                assert cards["dot_test.pxi"][0] == "identical", cards["dot_test.pxi"][1]
                assert cards["dot_test.pxi (dropped)"][0] == "identical", cards["dot_test.pxi (dropped)"][1]
                randoms = [v for k, v in cards.items() if k.startswith("random")]
                assert randoms and all(state == "identical" for state, _ in randoms), randoms

            page.wait_for_selector("#bench-status[data-state]", timeout=120_000)
            assert page.get_attribute("#bench-status", "data-state") == "done", page.inner_text("#bench-status")
            assert len(page.query_selector_all("#bench-rows tr")) >= 1
            assert page.query_selector("#bench-chart svg rect.bar-browser") is not None
            assert not errors, errors
            assert not failed, "cases failing in the browser:\n" + "\n".join(failed)
        finally:
            shot = REPO / "artifacts" / "web" / "page.png"
            shot.parent.mkdir(parents=True, exist_ok=True)
            try:
                page.screenshot(path=str(shot), full_page=True)
                if os.environ.get("PXVM_UPDATE_SCREENSHOT") == "1":  # refresh the README's
                    docs = REPO / "docs" / "images" / "web-page.png"
                    docs.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(shot, docs)
            except Exception:
                pass
            browser.close()


def _fetched_kernels(page) -> set[str]:
    """The kernel files the page fetches from now on."""
    names = set()
    page.on("request", lambda r: names.add(r.url.rsplit("/", 1)[-1])
            if "/kernels/" in r.url else None)
    return names


def test_page_declining_subgroups_runs_the_portable_kernels(page_url):
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page()
            kernels = _fetched_kernels(page)
            page.goto(page_url + "?subgroups=0")
            summary = page.wait_for_selector("#suite-summary:not([data-state=running])",
                                             timeout=120_000)
            assert summary.get_attribute("data-state") == "done", summary.inner_text()
            assert "no optional features" in page.inner_text("#plan-features")
            assert "matmul_quant.wgsl" in kernels
            assert not [k for k in kernels if "subgroups" in k], kernels
            failed = [r.inner_text() for r in page.query_selector_all("#suite-rows tr")
                      if r.get_attribute("data-state") != "pass"]
            assert not failed, "cases failing in the browser:\n" + "\n".join(failed)
        finally:
            browser.close()


def test_page_explains_missing_webgpu(page_url):
    """Without --enable-unsafe-webgpu this Chromium offers no adapter (SwiftShader is
    blocklisted): the page must say so and how to enable it, not hang or throw."""
    from playwright.sync_api import sync_playwright

    args = [a for a in CHROMIUM_ARGS if a != "--enable-unsafe-webgpu"]
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=args)
        try:
            page = browser.new_page()
            page.goto(page_url)
            page.wait_for_selector("#webgpu:not([data-state=checking])", timeout=60_000)
            text = page.inner_text("#webgpu")
            assert page.get_attribute("#webgpu", "data-state") == "missing"
            assert "no WebGPU adapter" in text and "--enable-unsafe-webgpu" in text
            assert page.get_attribute("#suite-summary", "data-state") == "no-webgpu"
        finally:
            browser.close()


ATTACKER_PAGE = """<!doctype html><script>
// what any page on the web can do without a CORS preflight
window.attack = async (target, program) => {
  await fetch(target + "api/program/upload", { method: "POST", mode: "no-cors",
    headers: { "Content-Type": "text/plain" }, body: new Uint8Array(program) }).catch(() => {});
  await new Promise((done) => {
    const img = new Image();
    img.onload = img.onerror = done;
    img.src = target + "api/bench/native";
  });
};
</script>"""


class _AttackerPage(BaseHTTPRequestHandler):
    def do_GET(self):
        body = ATTACKER_PAGE.encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/html")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def test_a_page_of_another_site_cannot_run_an_upload_or_the_benchmarks():
    """A page of another origin (a second loopback server, as localhost: Chromium's local
    network checks let a loopback page reach loopback) posts a program as text/plain and
    loads the native benchmarks as an image: both reach the server, which runs neither."""
    from importlib import resources

    from playwright.sync_api import sync_playwright

    from pxvm.serve.page import Page
    from pxvm.serve.server import HttpServer

    answered = {}
    srv = HttpServer(None, page=Page())
    app = srv.server.config.app

    async def recording(scope, receive, send):  # notes each answer's status
        async def noting(message):
            if message["type"] == "http.response.start":
                answered[scope["path"].rsplit("/", 1)[-1]] = message["status"]
            await send(message)
        await app(scope, receive, noting)

    srv.server.config.app = recording
    ran = []
    srv.page.planner.run = lambda *a: ran.append("upload") or ("error", "ran")
    srv.page.native.measure = lambda: ran.append("bench") or {"results": {}}
    srv.start()
    other = HTTPServer(("127.0.0.1", 0), _AttackerPage)
    threading.Thread(target=other.serve_forever, daemon=True).start()
    program = list(resources.files("pxvm.examples").joinpath("dot_test.pxi").read_bytes())
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
            try:
                page = browser.new_page()
                page.goto(f"http://localhost:{other.server_address[1]}/attacker.html")
                page.evaluate("([t, p]) => window.attack(t, p)", [srv.url + "/", program])
                assert answered == {"upload": 403, "native": 403}, answered
                assert ran == []
            finally:
                browser.close()
    finally:
        srv.stop()
        other.shutdown()
        other.server_close()
