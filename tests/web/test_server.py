"""The `pxvm serve` server: serves only the page, the shipped kernels and examples and
computed test data; refuses traversal, oversized uploads and foreign Host headers; binds
to loopback by default."""

from __future__ import annotations

import contextlib
import http.client
import inspect
import io
import json
import socket
import struct
import threading
import time
import zlib
from importlib import resources

import numpy as np
import pytest
from PIL import Image

from pxvm.backends.webgpu.runtime import load_wgsl
from pxvm.vm.protocol import OP_ADD, OP_DOT_RGB
from pxvm.web import httpd
from pxvm.web import server as web_server
from pxvm.web import uploads
from pxvm.serve import guard
from pxvm.serve.page import Page
from pxvm.serve.server import HttpServer


@contextlib.contextmanager
def serving(planner=None, **options):
    srv = HttpServer(None, page=Page(planner), **options).start()
    try:
        yield srv
    finally:
        srv.stop()


@pytest.fixture(scope="module")
def served():
    with serving() as srv:
        yield srv


def request(srv, method, path, body=None, headers=None):
    """A raw request: http.client sends the path exactly as given (no normalisation)."""
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=30)
    try:
        conn.request(method, path, body=body, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def session(srv) -> str:
    """The session token the page reads from /api/info (uploads must carry it)."""
    status, body = request(srv, "GET", "/api/info")
    assert status == 200
    return json.loads(body)["session"]


def with_session(srv, data: bytes) -> bytes:
    """Raw request bytes with the session header added after the request line."""
    line, _, rest = data.partition(b"\r\n")
    return line + b"\r\n" + httpd.SESSION_HEADER.encode() + b": " + session(srv).encode() + b"\r\n" + rest


def test_binds_to_loopback_by_default(served):
    assert served.server_address[0] == "127.0.0.1"
    assert inspect.signature(HttpServer).parameters["host"].default == "127.0.0.1"
    from pxvm.cli.web_commands import serve

    assert inspect.signature(serve).parameters["host"].default.default == "127.0.0.1"


def test_serves_page_and_the_package_kernels_as_the_runtime_loads_them(served):
    status, body = request(served, "GET", "/")
    assert status == 200 and b'src="/static/app.js"' in body
    for name in ("elementwise.wgsl", "pxvm_interpreter.wgsl", "matmul_quant_subgroups.wgsl"):
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
    token = {httpd.SESSION_HEADER: session(served)}
    status, body = request(served, "POST", "/api/program/upload", data,
                           {"Content-Type": "image/png", **token})
    plan = json.loads(body)
    assert status == 200 and plan["instructions"] == ["DOT_RGB"] and plan["dispatches"]
    status, body = request(served, "POST", "/api/program/upload", b"not a png at all", token)
    assert status == 400 and b"PNG" in body


def test_oversized_uploads_are_refused_unread(served):
    conn = http.client.HTTPConnection(*served.server_address[:2], timeout=30)
    try:
        conn.putrequest("POST", "/api/program/upload")
        conn.putheader("Content-Length", str(1 << 30))
        conn.putheader(httpd.SESSION_HEADER, session(served))
        conn.endheaders()  # no body sent: a huge upload is refused from the header alone
        resp = conn.getresponse()
        assert resp.status == 413
    finally:
        conn.close()
    # a little too large: the client sending it all still gets a clean 413
    status, body = request(served, "POST", "/api/program/upload", b"x" * (web_server.MAX_UPLOAD + 1),
                           {httpd.SESSION_HEADER: session(served)})
    assert status == 413 and b"4 MiB" in body


def test_foreign_host_header_is_refused_on_loopback(served):
    status, _ = request(served, "GET", "/", headers={"Host": "attacker.example:8765"})
    assert status == 403
    status, _ = request(served, "GET", "/", headers={"Host": "localhost:1234"})
    assert status == 200


def test_page_parses_bindings_with_the_runtime_pattern():
    """gpu.js builds bind group layouts with the regex of backends/webgpu/runtime/shaders.py; they must
    not drift apart, or the page and Python would bind the same file differently."""
    import re

    from pxvm.backends.webgpu.runtime import shaders

    js = resources.files("pxvm.web").joinpath("static", "gpu.js").read_text()
    found = re.search(r"const BINDING = /(.+)/g;", js)
    assert found and found.group(1) == shaders.BINDING.pattern


def test_ipv6_loopback_host_header_is_accepted():
    assert httpd.is_loopback("::1") and httpd.is_loopback("localhost")
    assert not httpd.is_loopback("0.0.0.0") and not httpd.is_loopback("example.org")


# ---- hostile uploads --------------------------------------------------------------------
def png_bytes(img) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img, "RGBA").save(buf, format="PNG")
    return buf.getvalue()


def chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def png_of_zeros(width, height, depth=8) -> bytes:
    """An all-zero RGBA PNG written row by row, never holding the image in memory."""
    deflate = zlib.compressobj(9)
    row = bytes(1 + width * 4 * depth // 8)
    idat = b"".join(deflate.compress(row) for _ in range(height)) + deflate.flush()
    ihdr = struct.pack(">IIBBBBB", width, height, depth, 6, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat) + chunk(b"IEND", b"")


def upload(srv, data, timeout=60, headers=None):
    """POST `data` as the page does (its session token, an image/png body); `headers` adds
    to or replaces those headers."""
    sent = {"Content-Type": "image/png", httpd.SESSION_HEADER: session(srv), **(headers or {})}
    conn = http.client.HTTPConnection(*srv.server_address[:2], timeout=timeout)
    try:
        conn.request("POST", "/api/program/upload", body=data, headers=sent)
        resp = conn.getresponse()
        return resp.status, json.loads(resp.read())
    finally:
        conn.close()


@pytest.fixture
def planner_calls(served, monkeypatch):
    """How many uploads reached the planning process."""
    calls = []
    run = served.page.planner.run
    monkeypatch.setattr(served.page.planner, "run", lambda *a: calls.append(1) or run(*a))
    return calls


def test_an_8192x8192_zero_png_upload_is_refused_quickly_from_its_header(served, planner_calls):
    data = png_of_zeros(8192, 8192)  # the 261 KB file, 256 MB once decoded
    assert len(data) < 300_000
    start = time.perf_counter()
    status, body = upload(served, data)
    assert time.perf_counter() - start < 1
    assert status == 413 and body["error"] == (
        "the upload is 8192x8192 = 67,108,864 pixels; at most 1,048,576 are accepted in an "
        "upload (run larger programs with `pxvm run`)")
    assert not planner_calls  # refused from the header: nothing was decoded


def test_a_20000x20000_header_upload_is_a_clear_error(served, planner_calls):
    ihdr = struct.pack(">IIBBBBB", 20000, 20000, 8, 6, 0, 0, 0)
    data = b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", b"x") + chunk(b"IEND", b"")
    status, body = upload(served, data)
    assert status == 413 and "20000x20000 = 400,000,000 pixels" in body["error"]
    assert not planner_calls


def test_a_16_bit_rgba_upload_is_refused_naming_its_bit_depth(served, planner_calls):
    status, body = upload(served, png_of_zeros(4, 4, depth=16))
    assert status == 400 and "bit depth 16 and colour type 6 (RGBA)" in body["error"]
    assert not planner_calls


def vector_program(op, width, count, height=2) -> bytes:
    """`count` instructions `op` 1 1 1 over a row of `width` non-zero pixels."""
    img = np.random.default_rng(0).integers(1, 256, (height, width, 4), dtype=np.uint8)
    img[0] = 0
    img[0, :count] = (op, 1, 1, 1)
    return png_bytes(img)


def test_an_upload_over_the_work_budget_is_refused_before_it_runs(served):
    start = time.perf_counter()
    status, body = upload(served, vector_program(OP_ADD, 1 << 19, 4096))
    assert status == 400 and "ADD counts 1,572,864 toward the work budget" in body["error"]
    assert time.perf_counter() - start < 10  # planning it would take seconds more


@pytest.fixture(scope="module")
def slow_upload() -> bytes:
    """A program at the work budget within the upload's pixel cap: seconds of CPU work."""
    return vector_program(OP_DOT_RGB, 1 << 19, 4096)


def wait_for(condition, seconds=20.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_others_are_served_while_an_upload_is_planned_and_a_gone_client_stops_it(served, slow_upload):
    stopped = served.page.planner.stopped
    client = socket.create_connection(served.server_address[:2], timeout=30)
    client.sendall(with_session(served, b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\n"
                                b"Content-Length: " + str(len(slow_upload)).encode() + b"\r\n\r\n"
                                + slow_upload))
    wait_for(lambda: served.page.planner.running)
    start = time.perf_counter()
    status, body = request(served, "GET", "/api/info")
    assert status == 200 and json.loads(body)["max_upload_pixels"] == 1 << 20
    assert time.perf_counter() - start < 2 and served.page.planner.running  # still planning
    client.close()  # the client gives up: its planning process is killed
    wait_for(lambda: not served.page.planner.running, seconds=5)
    assert served.page.planner.stopped == stopped + 1


def test_an_upload_planned_past_the_time_limit_is_stopped_with_503(slow_upload):
    with serving(uploads.PlanRunner(seconds=0.5)) as srv:
        start = time.perf_counter()
        status, body = upload(srv, slow_upload)
        assert status == 503 and body["error"] == (
            "planning this program took more than 0.5 s and was stopped; run it with `pxvm run`")
        assert time.perf_counter() - start < 5 and srv.page.planner.stopped == 1


def test_an_upload_needing_more_memory_than_allowed_is_refused_with_413():
    img = np.random.default_rng(1).integers(0, 256, (500, 2048, 4), dtype=np.uint8)
    img[0] = 0  # no instructions: the plan's JSON alone needs the memory
    program = png_bytes(img)
    with serving(uploads.PlanRunner(memory=180 << 20)) as srv:  # the process alone ~160 MB
        status, body = upload(srv, program)
        assert status in (413, 503), body
        assert "memory" in body["error"] or "ended without an answer" in body["error"]


def test_uploads_past_the_planning_slots_get_503_at_once():
    data = resources.files("pxvm.examples").joinpath("dot_test.pxi").read_bytes()
    with serving(uploads.PlanRunner(workers=0)) as srv:
        status, body = upload(srv, data)
        assert status == 503 and "planning other uploads" in body["error"]


def test_a_plan_over_the_response_cap_is_refused(monkeypatch):
    data = resources.files("pxvm.examples").joinpath("dot_test.pxi").read_bytes()
    assert json.loads(uploads.upload_plan(data))["instructions"] == ["DOT_RGB"]
    monkeypatch.setattr(uploads, "MAX_RESPONSE", 1000)
    with pytest.raises(uploads.ResponseTooLarge, match=r"plan is [\d,]+ bytes of JSON; "
                                                          r"responses are limited to 1,000"):
        uploads.upload_plan(data)


def test_no_response_exceeds_the_cap(served, monkeypatch):
    monkeypatch.setattr(httpd, "MAX_RESPONSE", 100)
    status, body = request(served, "GET", "/api/info")
    assert status == 500 and len(body) < 200 and b"over the server's limit of 100" in body


# ---- requests from other sites' pages --------------------------------------------------
@pytest.fixture
def native_runs(served, monkeypatch):
    """How many times the native benchmarks were asked to run."""
    runs = []
    monkeypatch.setattr(served.page.native, "measure", lambda: runs.append(1) or {"results": {}})
    return runs


def test_a_cross_site_text_plain_post_runs_nothing(served, planner_calls):
    # what a page elsewhere can send without a preflight: text/plain, its own Origin
    data = resources.files("pxvm.examples").joinpath("dot_test.pxi").read_bytes()
    port = served.server_address[1]
    status, body = request(served, "POST", "/api/program/upload", data,
                           {"Content-Type": "text/plain", "Origin": "http://attacker.example",
                            "Sec-Fetch-Site": "cross-site"})
    assert status == 403 and "cross-site request refused" in json.loads(body)["error"]
    # the same without the session token (a browser without Origin or Sec-Fetch-Site)
    status, body = request(served, "POST", "/api/program/upload", data,
                           {"Content-Type": "text/plain", "Host": f"localhost:{port}"})
    assert status == 403 and "X-Pxvm-Session header" in json.loads(body)["error"]
    assert planner_calls == []


def test_an_img_get_of_the_native_benchmark_from_another_site_starts_nothing(served, native_runs):
    img = {"Sec-Fetch-Site": "cross-site", "Sec-Fetch-Mode": "no-cors", "Sec-Fetch-Dest": "image"}
    status, body = request(served, "GET", "/api/bench/native", headers=img)
    assert status == 403 and "Sec-Fetch-Site is 'cross-site'" in json.loads(body)["error"]
    status, _ = request(served, "GET", "/api/bench/native")  # no token
    assert status == 403 and native_runs == []
    status, _ = request(served, "GET", "/api/bench/native",
                        headers={httpd.SESSION_HEADER: session(served)})
    assert status == 200 and native_runs == [1]


@pytest.mark.parametrize("headers", [
    {"Origin": "http://attacker.example"}, {"Origin": "null"},
    {"Origin": "http://localhost.attacker.example:{port}"}, {"Origin": "https://127.0.0.1:{port}"},
    {"Origin": "http://127.0.0.1:1"}, {"Sec-Fetch-Site": "same-site"},
    {"Sec-Fetch-Site": "cross-site"}, {"Sec-Fetch-Site": "same-origin, cross-site"},
])
def test_cross_site_api_requests_get_403_with_a_json_error(served, planner_calls, headers):
    port = served.server_address[1]
    sent = {k: v.format(port=port) for k, v in headers.items()}
    for method, path in (("GET", "/api/case/add"), ("GET", "/api/info")):
        status, body = request(served, method, path, headers=sent)
        assert status == 403 and "cross-site request refused" in json.loads(body)["error"]
    status, body = upload(served, resources.files("pxvm.examples").joinpath("dot_test.pxi")
                          .read_bytes(), headers=sent)
    assert status == 403 and planner_calls == []


def test_same_origin_requests_from_the_page_are_served(served):
    data = resources.files("pxvm.examples").joinpath("dot_test.pxi").read_bytes()
    port = served.server_address[1]
    page = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}",
            "Sec-Fetch-Site": "same-origin"}
    status, body = upload(served, data, headers=page)
    assert status == 200 and body["instructions"] == ["DOT_RGB"]
    status, _ = request(served, "GET", "/api/case/add", headers=page)
    assert status == 200
    # the page itself may be opened from a link elsewhere, or typed in
    for site in ("cross-site", "none"):
        status, body = request(served, "GET", "/", headers={"Sec-Fetch-Site": site})
        assert status == 200 and b"app.js" in body


# ---- hostile requests -------------------------------------------------------------------
def raw_exchange(srv, data: bytes, half_close=True, timeout=30) -> tuple[int, dict, bytes]:
    """Send raw bytes; (status, headers, body) of the first response."""
    with socket.create_connection(srv.server_address[:2], timeout=timeout) as conn:
        conn.sendall(data)
        if half_close:
            try:
                conn.shutdown(socket.SHUT_WR)
            except OSError:  # the server closed first: its answer (a 503) may be here
                pass
        received = b""
        while b"\r\n\r\n" not in received:
            part = conn.recv(65536)
            assert part, f"connection closed without an answer: {received!r}"
            received += part
        head, _, body = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        headers = {k.lower(): v.strip() for k, _, v in (h.partition(":") for h in lines[1:])}
        while len(body) < int(headers.get("content-length", 0)):
            part = conn.recv(65536)
            assert part
            body += part
        return int(lines[0].split()[1]), headers, body


@pytest.mark.parametrize("data,status,message", [
    (b"BREW / HTTP/1.1\r\nHost: localhost\r\n\r\n", 405, b"method 'BREW' is not served"),
    (b"DELETE /api/info HTTP/1.1\r\nHost: localhost\r\n\r\n", 405, b"use GET, HEAD or POST"),
    (b"GET /\r\n\r\n", 400, b"malformed request"),  # HTTP/0.9: h11 refuses it
    (b"GET / HTTP/2.0\r\n\r\n", 403, b"only requests to localhost"),  # no Host
    (b"GET / XTTP/1.1\r\n\r\n", 400, b"malformed request"),
    (b"\x00\xff garbage\r\n\r\n", 400, b"malformed request"),
    (b"GET http://[::1/ HTTP/1.1\r\nHost: localhost\r\n\r\n", 403, b"path refused"),
    (b"GET /" + b"a" * 70000 + b" HTTP/1.1\r\n\r\n", 400, b"malformed request"),
    (b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 12x\r\n\r\n",
     400, b"one Content-Length"),
    (b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 4\r\n"
     b"Content-Length: 5\r\n\r\nabcd", 400, b"malformed request"),
    (b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: -5\r\n\r\n",
     400, b"one Content-Length"),
    # the client half-closes before the body it declared has come: answered at once, not
    # when the body deadline passes
    (b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\nContent-Length: 100\r\n"
     b"\r\n0123456789", 400, b"the body ended: 10 of the 100 bytes"),
    (b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked"
     b"\r\n\r\n4\r\nabcd\r\n0\r\n\r\n", 411, b"chunked bodies are not accepted"),
    (b"GET /api/program/random?seed=-1 HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
     b"seed must be an integer in 0..4294967295, got '-1'"),
    (b"GET /api/program/random?seed=1e3 HTTP/1.1\r\nHost: localhost\r\n\r\n", 400, b"got '1e3'"),
    (b"GET /api/program/random?seed=" + b"9" * 5000 + b" HTTP/1.1\r\nHost: localhost\r\n\r\n",
     400, b"seed must be given once, at most 200 characters"),
    (b"GET /api/case/add?seed=4294967296 HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
     b"seed must be an integer in 0..4294967295"),
    (b"GET /api/program/random?seed=1&seed=2 HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
     b"got '1, 2'"),
    (b"GET /api/case/add?features=shader-f64 HTTP/1.1\r\nHost: localhost\r\n\r\n", 400,
     b"unknown plan features ['shader-f64']: a plan may use subgroups"),
    (b"GET /api/case/add?features=subgroups&features=subgroups HTTP/1.1\r\nHost: localhost"
     b"\r\n\r\n", 400, b"features must be given once"),
    (b"GET /api/case/add--1 HTTP/1.1\r\nHost: localhost\r\n\r\n", 404,
     b"no conformance case 'add--1'"),
    (b"GET /api/case/add-999999999999 HTTP/1.1\r\nHost: localhost\r\n\r\n", 404,
     b"no conformance case"),
    (b"GET /api/bench/nope HTTP/1.1\r\nHost: localhost\r\n\r\n", 404, b"no benchmark 'nope'"),
    (b"GET /api/program/example/..%2fx.pxi HTTP/1.1\r\nHost: localhost\r\n\r\n", 403,
     b"path refused"),
])
def test_malformed_requests_get_a_clear_json_4xx_with_a_status_line(served, data, status, message):
    if data.startswith(b"POST"):  # refused for want of the token before anything else
        data = with_session(served, data)
    got, headers, body = raw_exchange(served, data)
    assert got == status, body
    assert headers["content-type"] == "application/json" and message in body
    assert "error" in json.loads(body)
    if status == 405:
        assert headers["allow"] == "GET, HEAD, POST"


def test_valid_seeds_and_case_ids_still_work(served):
    for path in ("/api/program/random?seed=4294967295", "/api/case/add?seed=0", "/api/case/add-1"):
        status, body = request(served, "GET", path)
        assert status == 200 and json.loads(body)["buffers"]


def test_a_case_plan_uses_the_subgroup_variants_only_where_the_page_asks(served):
    # a decoding product (one row of x): its columns' threads summed by subgroups or not
    def kernels(query):
        status, body = request(served, "GET", "/api/case/rmsnorm_matmul_quant" + query)
        assert status == 200
        return {d["kernel"] for d in json.loads(body)["dispatches"]}

    assert kernels("?features=subgroups") == {"matmul_quant_subgroups.wgsl"}
    assert kernels("") == kernels("?features=") == {"matmul_quant.wgsl"}


def test_a_body_that_does_not_arrive_in_time_is_answered_408(served, monkeypatch):
    monkeypatch.setattr(guard, "BODY_SECONDS", 0.5)
    start = time.perf_counter()
    data = with_session(served, b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\n"
                                b"Content-Length: 100\r\n\r\nabc")
    status, _, body = raw_exchange(served, data, half_close=False)
    assert status == 408 and b"did not arrive within 0.5 s: 3 of the 100 bytes" in body
    assert time.perf_counter() - start < 5


def test_a_get_with_a_body_is_answered_and_its_body_never_read_as_a_request(served):
    smuggled = b"GET /api/info HTTP/1.1\r\nHost: localhost\r\n\r\n"
    data = (b"GET /api/bench/nope HTTP/1.1\r\nHost: localhost\r\nContent-Length: "
            + str(len(smuggled)).encode() + b"\r\n\r\n" + smuggled)
    with socket.create_connection(served.server_address[:2], timeout=30) as conn:
        conn.sendall(data)
        received = b""
        while part := conn.recv(65536):  # the server closes after its one answer
            received += part
    assert received.count(b"HTTP/1.1 ") == 1 and b" 404 " in received


def test_connections_past_the_cap_get_503_and_are_closed():
    with serving(max_connections=1) as srv:
        with socket.create_connection(srv.server_address[:2], timeout=30) as idle:
            idle.sendall(b"GET /api/info HTTP/1.1\r\nHost: localhost\r\n\r\n")
            idle.recv(100)  # answered; the connection stays open (keep-alive)
            status, headers, body = raw_exchange(srv, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n")
            assert status == 503 and b"try again" in body and headers["connection"] == "close"


def page_status(srv) -> tuple[int | None, bytes]:
    """(status, body) of GET /, or (None, b"") when the connection was reset first (a
    503 answered and closed before the request was all sent)."""
    try:
        status, _, body = raw_exchange(srv, b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n",
                                       half_close=False, timeout=10)
        return status, body
    except (OSError, AssertionError):
        return None, b""


def test_clients_trickling_their_headers_lose_their_slots_at_the_header_deadline(monkeypatch):
    # 70 connections, each sending its request a byte at a time: they fill the 64 slots,
    # and are closed when HEADER_SECONDS is up (then the lingering close)
    monkeypatch.setattr(httpd, "HEADER_SECONDS", 2.0)
    line = b"GET / HTTP/1.1\r\nHost: localhost\r\nX-Slow: " + b"a" * 200
    with serving() as srv:
        slow = [socket.create_connection(srv.server_address[:2], timeout=10) for _ in range(70)]
        stop = threading.Event()

        def trickle():
            for i in range(len(line)):
                for conn in slow:
                    with contextlib.suppress(OSError):  # closed by the server
                        conn.sendall(line[i:i + 1])
                if stop.wait(0.25):
                    return

        sender = threading.Thread(target=trickle, daemon=True)
        sender.start()
        try:
            time.sleep(0.5)
            assert page_status(srv)[0] == 503  # held while they last
            start = time.perf_counter()
            status, body = page_status(srv)
            while status != 200 and time.perf_counter() - start < 15:
                time.sleep(0.25)
                status, body = page_status(srv)
            assert status == 200 and b"app.js" in body
            assert time.perf_counter() - start < 2.0 + 2
            for conn in slow:  # each was closed (past the deadline, or at once with a 503)
                received = b""
                with contextlib.suppress(ConnectionResetError):
                    while part := conn.recv(65536):
                        received += part
                assert received in (b"", httpd.BUSY_RESPONSE)
        finally:
            stop.set()
            sender.join()
            for conn in slow:
                conn.close()
