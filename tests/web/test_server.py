"""The `pxvm serve` server: serves only the page, the shipped kernels and examples and
computed test data; refuses traversal, oversized uploads and foreign Host headers; binds
to loopback by default."""

from __future__ import annotations

import http.client
import inspect
import json
import threading
from importlib import resources

import pytest

from pxvm.runtime.webgpu import load_wgsl
from pxvm.web import server as web_server


@pytest.fixture(scope="module")
def served():
    srv = web_server.make_server(port=0)
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def request(srv, method, path, body=None, headers=None):
    """A raw request: http.client sends the path exactly as given (no normalisation)."""
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_binds_to_loopback_by_default(served):
    assert served.server_address[0] == "127.0.0.1"
    assert inspect.signature(web_server.make_server).parameters["host"].default == "127.0.0.1"
    from pxvm.cli.web_commands import serve

    assert inspect.signature(serve).parameters["host"].default.default == "127.0.0.1"


def test_serves_page_and_the_package_kernels_byte_for_byte(served):
    status, body = request(served, "GET", "/")
    assert status == 200 and b'src="/static/app.js"' in body
    for name in ("elementwise.wgsl", "pxvm_interpreter.wgsl"):
        status, body = request(served, "GET", f"/kernels/{name}")
        assert status == 200 and body.decode() == load_wgsl(name)
    status, body = request(served, "GET", "/api/info")
    info = json.loads(body)
    assert status == 200 and "add" in {c["op"] for c in info["cases"]}


@pytest.mark.parametrize("path", [
    "/../pyproject.toml", "/static/../server.py", "/static/..%2fserver.py",
    "/%2e%2e/%2e%2e/etc/passwd", "/kernels/%2e%2e%2f%2e%2e%2fweb%2fplans.py",
    "/static/%252e%252e%252fplans.py", "//etc/passwd", "/static/..\\server.py",
    "/static/%5c..%5cserver.py", "/kernels/.%2e/ops/registry.py", "/etc/passwd",
    "/static//etc/passwd", "/kernels/%00elementwise.wgsl", "/examples/../vm/cpu.py",
    "/static/server.py", "/kernels/elementwise.py", "/api/case/..%2f..%2fetc",
])
def test_paths_outside_the_served_files_are_refused(served, path):
    status, body = request(served, "GET", path)
    assert status in (403, 404)
    assert b"import" not in body and b"root:" not in body


def test_upload_runs_a_program_and_returns_the_cpu_result(served):
    pytest.importorskip("pxvm.vm")
    data = resources.files("pxvm.examples").joinpath("dot_test.pxi").read_bytes()
    status, body = request(served, "POST", "/api/program/upload", data, {"Content-Type": "image/png"})
    plan = json.loads(body)
    assert status == 200 and plan["instructions"] == ["DOT_RGB"] and plan["dispatches"]
    status, body = request(served, "POST", "/api/program/upload", b"not a png at all")
    assert status == 400 and b"PNG" in body


def test_oversized_uploads_are_refused_unread(served):
    conn = http.client.HTTPConnection(*served.server_address[:2], timeout=30)
    try:
        conn.putrequest("POST", "/api/program/upload")
        conn.putheader("Content-Length", str(1 << 30))
        conn.endheaders()  # no body sent: a huge upload is refused from the header alone
        resp = conn.getresponse()
        assert resp.status == 413
    finally:
        conn.close()
    # a little too large: the client sending it all still gets a clean 413
    status, body = request(served, "POST", "/api/program/upload", b"x" * (web_server.MAX_UPLOAD + 1))
    assert status == 413 and b"4 MiB" in body


def test_foreign_host_header_is_refused_on_loopback(served):
    status, _ = request(served, "GET", "/", headers={"Host": "attacker.example:8765"})
    assert status == 403
    status, _ = request(served, "GET", "/", headers={"Host": "localhost:1234"})
    assert status == 200


def test_page_parses_bindings_with_the_runtime_pattern():
    """gpu.js builds bind group layouts with the regex of runtime/webgpu/shaders.py; they must
    not drift apart, or the page and Python would bind the same file differently."""
    import re

    from pxvm.runtime.webgpu import shaders

    js = resources.files("pxvm.web").joinpath("static", "gpu.js").read_text()
    found = re.search(r"const BINDING = /(.+)/g;", js)
    assert found and found.group(1) == shaders.BINDING.pattern


def test_ipv6_loopback_host_header_is_accepted():
    assert web_server.is_loopback("::1") and web_server.is_loopback("localhost")
    assert not web_server.is_loopback("0.0.0.0") and not web_server.is_loopback("example.org")
