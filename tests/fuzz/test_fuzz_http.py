"""Fuzzing the `pxvm serve` server: one server process for the module (`python -m pxvm
serve --port 0`, under an RLIMIT_AS of 1.5 GB and without PXVM_DEVICE, so that no GPU is
touched), and requests drawn from a grammar: methods, paths with traversal and encodings,
query strings, Host headers, Content-Length lies, chunked and Expect headers, HTTP
versions, Origin / Sec-Fetch-Site / Content-Type headers, and upload bodies from mutated
.pxi files (pxi_mutations.py). Every request,
sent with a 30 s client timeout, must be answered with a status below 500 and a body (a
JSON error for every refusal), never a hang; the server must be alive and within its
memory limit at the end; and every request that a browser marks as sent by another site's
page (test_fuzz_http_cross_site) must be refused with 403 (or, malformed, with the HTTP
parser's 400) before it starts any work, the session token or not. The server process is the bounded one here, not a BoundedWorker:
its outcomes and peak memory (VmHWM) are saved as the "http" figures."""

from __future__ import annotations

import json
import os
import re
import resource
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from harness import FUZZ, MEMORY_BYTES, FuzzStats
from hypothesis import given
from hypothesis import strategies as st
from pxi_mutations import encode, mutated_pxi, page_program

KIND = "http"
#: a one-in-ten (or one-in-twenty) choice: a middle value, as hypothesis draws the ends of
#: a range (and of a list to sample) more often
RARELY = st.integers(0, 9).map(lambda v: v == 4)
SELDOM = st.integers(0, 19).map(lambda v: v == 9)
CLIENT_SECONDS = 30.0
ROOT = Path(__file__).resolve().parents[2]

METHODS = ["GET"] * 6 + ["HEAD", "POST", "POST", "POST", "PUT", "DELETE", "OPTIONS", "PATCH",
                         "TRACE", "CONNECT", "BREW", "get", "G\x00T", "X" * 200]
# every route the server has (but /api/bench/native, which runs GPU benchmarks) and near misses
ROUTES = ["/", "/index.html", "/static/app.js", "/static/style.css", "/static/gpu.js",
          "/static/index.html", "/static/missing.js", "/static/{j}", "/kernels/elementwise.wgsl",
          "/kernels/pxvm_interpreter.wgsl", "/kernels/{j}", "/examples/dot_test.pxi",
          "/examples/{j}", "/api/info", "/api/case/add", "/api/case/matmul-1", "/api/case/{j}",
          "/api/bench/matmul", "/api/bench/softmax", "/api/bench/{j}", "/api/program/random",
          "/api/program/example/dot_test.pxi", "/api/program/example/{j}",
          "/api/program/upload", "/api/{j}", "/{j}", "/api/program/upload/{j}"]
JUNK_SEGMENTS = ["..", ".", "%2e%2e", "%2E%2e", "%252e%252e", "..%2f..%2fetc%2fpasswd",
                 "..%5c..%5cserver.py", "%00", "%", "%zz", "\\..\\", "~", "etc/passwd",
                 "server.py", "app.js%00.png", "%C3%A9", "\u00e9", "add--1", "add-99999999999",
                 "matmul-0", "..;", "x" * 3000, "", "%2f", "//", "./", "*"]
SEEDS = ["0", "1", "4294967295", "4294967296", "-1", "1.5", "0x10", "", "9" * 5000, "%00",
         "\u0663", "1e3", " 1", "nan"]
HOSTS = ["localhost", "localhost:{port}", "127.0.0.1", "127.0.0.1:{port}", "[::1]", "[::1]:{port}",
         "attacker.example", "attacker.example:{port}", "", "localhost.", "127.0.0.2", "0.0.0.0",
         "LOCALHOST", "[::1", "x" * 1000, "localhost:abc", "[::ffff:127.0.0.1]", None]
# what pages of other sites send (their origin, or "null" from a sandboxed frame or a
# file), and how browsers say where a request comes from
FOREIGN_ORIGINS = ["http://attacker.example", "null", "http://localhost.attacker.example:{port}",
                   "https://localhost:{port}", "http://localhost:1", "http://127.0.0.1:{port}.x",
                   "http://[::1]:{port}", "", "http://localhost:{port}/", "x" * 3000,
                   "http://localhost:{port}, http://attacker.example"]
FOREIGN_SITES = ["cross-site", "same-site", "CROSS-SITE", " cross-site ", "same-origin, cross-site",
                 "", "bogus", "cross-site\x00"]
CONTENT_TYPES = ["text/plain", "text/plain; charset=utf-8", "application/x-www-form-urlencoded",
                 "multipart/form-data; boundary=x", "application/json", "image/png", "",
                 "application/octet-stream"]
VERSIONS = ["HTTP/1.1"] * 6 + ["HTTP/1.0", "HTTP/1.0", "HTTP/2.0", "HTTP/0.9", "HTTP/1.1.1",
                               "http/1.1", "HTTP/x", None]


def _limit_memory():  # the server's bound: the 1.5 GB
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))


@dataclass
class Served:
    process: subprocess.Popen
    port: int
    stats: FuzzStats
    stderr: Path
    session: str = ""  # the token uploads carry, from /api/info

    def memory_peak(self) -> int:
        text = Path(f"/proc/{self.process.pid}/status").read_text()
        return int(re.search(r"VmHWM:\s+(\d+) kB", text).group(1)) * 1024


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    stderr = tmp_path_factory.mktemp("serve") / "stderr.log"
    env = {k: v for k, v in os.environ.items() if k != "PXVM_DEVICE"}
    env["PYTHONUNBUFFERED"] = "1"
    with open(stderr, "wb") as err:
        process = subprocess.Popen([sys.executable, "-m", "pxvm", "serve", "--port", "0"],
                                   stdout=subprocess.PIPE, stderr=err, env=env, cwd=ROOT,
                                   preexec_fn=_limit_memory, text=True)
    line = process.stdout.readline()  # "pxvm page at http://127.0.0.1:PORT/ ..."
    found = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
    assert found, f"the server did not start: {line!r} {stderr.read_text()[-2000:]}"
    server = Served(process, int(found.group(1)), FuzzStats(KIND), stderr)
    _, _, info = exchange(server.port, b"GET /api/info HTTP/1.1\r\nHost: localhost\r\n"
                                       b"Connection: close\r\n\r\n", False, False)
    server.session = json.loads(info)["session"]
    yield server
    if process.poll() is None:
        server.stats.peak_rss_bytes = server.memory_peak()
    server.stats.save()
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


# ---- the client ---------------------------------------------------------------------------
class NoAnswer(Exception):
    """The connection ended without a complete HTTP response."""


def exchange(port: int, data: bytes, half_close: bool, head: bool) -> tuple[int, dict, bytes]:
    """Send raw bytes on a new connection; (status, headers, body) of the final response
    (1xx responses skipped)."""
    with socket.create_connection(("127.0.0.1", port), timeout=CLIENT_SECONDS) as conn:
        try:
            conn.sendall(data)
            if half_close:
                conn.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            pass  # answered and closed before all of it was sent: read the answer
        buffer = b""

        def more():
            nonlocal buffer
            part = conn.recv(1 << 16)
            if not part:
                raise NoAnswer(f"the connection ended after {buffer[:300]!r}")
            buffer += part

        while True:
            while b"\r\n\r\n" not in buffer:
                more()
            head_bytes, _, buffer = buffer.partition(b"\r\n\r\n")
            lines = head_bytes.decode("latin-1").split("\r\n")
            status_line = re.fullmatch(r"HTTP/1\.[01] (\d{3}) .*", lines[0])
            if not status_line:
                raise NoAnswer(f"not a status line: {lines[0][:200]!r}")
            status = int(status_line.group(1))
            if 100 <= status < 200:
                continue
            headers = {}
            for h in lines[1:]:
                name, _, value = h.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = 0 if head else int(headers.get("content-length", "0"))
            while len(buffer) < length:
                more()
            return status, headers, buffer[:length]


# ---- the requests ------------------------------------------------------------------------
@st.composite
def path(draw) -> str:
    route = draw(st.sampled_from(ROUTES))
    route = route.replace("{j}", "/".join(draw(st.lists(st.sampled_from(JUNK_SEGMENTS),
                                                        min_size=1, max_size=3))))
    for _ in range(draw(st.integers(0, 2))):  # encode, double, or insert traversal
        kind = draw(st.sampled_from(["encode", "slash", "dots", "backslash"]))
        at = draw(st.integers(0, len(route)))
        if kind == "encode" and route:
            at = min(at, len(route) - 1)
            route = route[:at] + "".join(f"%{b:02X}" for b in route[at].encode()) + route[at + 1:]
        elif kind == "slash":
            route = route[:at] + "/" + route[at:]
        elif kind == "dots":
            route = route[:at] + draw(st.sampled_from(["/..", "/%2e%2e", "/.", "%2f.."])) + route[at:]
        else:
            route = route[:at] + "\\" + route[at:]
    if draw(st.booleans()):
        params = draw(st.lists(st.one_of(st.sampled_from(SEEDS).map(lambda s: f"seed={s}"),
                                         st.sampled_from(["seed", "=", "a=b", "&", "%zz=1",
                                                          "seed=1&seed=2", "x" * 500])),
                               max_size=3))
        route += "?" + "&".join(params)
    if draw(RARELY):
        route = draw(st.sampled_from(["*", "http://localhost/api/info", "http://[::1/",
                                      "api/info", "", "//api/info"]))
    return route


@st.composite
def upload_body(draw) -> bytes:
    kind = draw(st.sampled_from(["valid", "mutated", "mutated", "random", "empty"]))
    if kind == "valid":
        return encode(page_program(draw(st.integers(0, 2**32 - 1))))
    if kind == "mutated":
        return draw(mutated_pxi(pixels=2, ihdr=1, byte_level=2))
    if kind == "random":
        return draw(st.binary(max_size=512))
    return b""


@dataclass
class Case:
    data: bytes
    half_close: bool
    head: bool
    summary: str


@st.composite
def request(draw, port: int, session: str) -> Case:
    method = draw(st.sampled_from(METHODS))
    target = draw(path())
    version = draw(st.sampled_from(VERSIONS))
    line = f"{method} {target}" + (f" {version}" if version else "")
    headers = []
    host = draw(st.sampled_from(HOSTS))
    if host is not None:
        headers.append(f"Host: {host.format(port=port)}")
    body = draw(upload_body()) if method == "POST" or draw(RARELY) else b""
    length = draw(st.sampled_from(["right"] * 6 + ["none", "less", "more", "negative", "junk",
                                                   "twice", "huge"]))
    declared = {"right": len(body), "less": max(0, len(body) - 7), "more": len(body) + 1000,
                "huge": 2**40}.get(length)
    if length == "negative":
        headers.append("Content-Length: -5")
    elif length == "junk":
        headers.append(f"Content-Length: {draw(st.sampled_from(['12x', '', '1e3', '0x10', ' ']))}")
    elif length == "twice":
        headers += [f"Content-Length: {len(body)}"] * 2
    elif declared is not None and (body or method == "POST"):
        headers.append(f"Content-Length: {declared}")
    if draw(st.integers(0, 3)) > 0:  # mostly, so that uploads get past the token check
        headers.append(f"X-Pxvm-Session: {session}")
    if draw(RARELY):
        headers.append(f"Origin: {draw(st.sampled_from(FOREIGN_ORIGINS)).format(port=port)}")
    if draw(RARELY):
        headers.append(f"Sec-Fetch-Site: {draw(st.sampled_from(FOREIGN_SITES + ['same-origin']))}")
    if draw(RARELY):
        headers.append(f"Content-Type: {draw(st.sampled_from(CONTENT_TYPES))}")
    if draw(RARELY):
        headers.append("Transfer-Encoding: chunked")
    if draw(RARELY):
        headers.append("Expect: 100-continue")
    headers.append(draw(st.sampled_from(["Connection: close", "Connection: keep-alive", ""])))
    if draw(SELDOM):
        headers += draw(st.sampled_from([["X" * 70000 + ": 1"], ["no colon here"],
                                         [f"X-{i}: {i}" for i in range(120)]]))
    head = f"{line}\r\n" + "".join(h + "\r\n" for h in headers if h) + "\r\n"
    data = head.encode("utf-8", "surrogatepass") + body
    # a client that declares more than it sends ends its side, as a real one would by
    # closing; otherwise the server would wait for the rest
    lying = declared is not None and declared > len(body)
    # a HEAD's answer may leave its body out whatever version the line names (h11 reads
    # the method of a line whose version it refuses, or not): none is waited for
    return Case(data, lying, method == "HEAD",
                f"{line[:120]!r} + {len(headers)} headers, body {len(body)} B, length {length}")


#: Routes that start work (an upload, the native benchmarks) or compute test data, and the
#: page's info (which holds the session token)
API_ROUTES = ["/api/program/upload", "/api/bench/native", "/api/case/add", "/api/info",
              "/api/program/random?seed=1", "/api/program/example/dot_test.pxi",
              "/api/bench/matmul"]


@st.composite
def cross_site_request(draw, port: int, session: str) -> Case:
    """A request a page elsewhere could make a browser send (with or without the session
    token, which it cannot read, and any content type): at least one foreign Origin or
    Sec-Fetch-Site header."""
    method = draw(st.sampled_from(["GET", "HEAD", "POST", "POST"]))
    target = draw(st.sampled_from(API_ROUTES))
    host = draw(st.sampled_from(["localhost:{port}", "127.0.0.1:{port}", "[::1]:{port}",
                                 "localhost"])).format(port=port)
    foreign = draw(st.sampled_from(["origin", "site", "both"]))
    headers = [f"Host: {host}"]
    if foreign in ("origin", "both"):
        foreign_origin = st.sampled_from(FOREIGN_ORIGINS).map(lambda o: o.format(port=port)) \
            .filter(lambda o: o.lower() != f"http://{host}".lower())
        for _ in range(draw(st.integers(1, 2))):  # a second Origin header is foreign too
            headers.append(f"Origin: {draw(foreign_origin)}")
    elif draw(st.booleans()):
        headers.append(f"Origin: http://{host}")  # its own origin, with a foreign site
    if foreign in ("site", "both"):
        headers.append(f"Sec-Fetch-Site: {draw(st.sampled_from(FOREIGN_SITES))}")
    elif draw(st.booleans()):
        headers.append(f"Sec-Fetch-Site: {draw(st.sampled_from(['same-origin', 'none']))}")
    if draw(st.booleans()):
        headers.append(f"X-Pxvm-Session: {session}")
    if draw(st.booleans()):
        headers.append(f"Content-Type: {draw(st.sampled_from(CONTENT_TYPES))}")
    body = encode(page_program(draw(st.integers(0, 2**32 - 1)))) if method == "POST" else b""
    if method == "POST":
        headers.append(f"Content-Length: {len(body)}")
    headers = draw(st.permutations(headers))
    head = f"{method} {target} HTTP/1.1\r\n" + "".join(h + "\r\n" for h in headers) + "\r\n"
    return Case(head.encode("utf-8", "surrogatepass") + body, False, method == "HEAD",
                f"{method} {target} + {headers!r}"[:600])


def _check(served: Served, case: Case, expected: int | None = None) -> None:
    start = time.perf_counter()
    stats = served.stats
    try:
        status, _, body = exchange(served.port, case.data, case.half_close, case.head)
    except TimeoutError:
        outcome, message = "hang", f"no answer within {CLIENT_SECONDS:.0f} s"
    except (NoAnswer, OSError) as exc:
        outcome, message = "crash", f"{type(exc).__name__}: {exc}"
    else:
        outcome, message = ("ok" if status < 400 else "error" if status < 500 else "crash"), ""
        if status >= 500:
            message = f"status {status}: {body[:300]!r}"
        elif status >= 400 and not case.head:  # a refusal is a clear JSON error
            error = json.loads(body).get("error")
            if not (isinstance(error, str) and error.strip()):
                outcome, message = "crash", f"status {status} without an error: {body[:300]!r}"
        elif not case.head and not body:
            outcome, message = "crash", f"status {status} with an empty body"
    # a request the HTTP parser refuses (a NUL in a header, say) reaches no route: its
    # 400 ("malformed request", unread after a HEAD) starts no work either; the server's
    # own checks refuse a cross-site request with 403 before anything that answers 400
    unparsed = outcome == "error" and status == 400 and (case.head or b"malformed request" in body)
    if expected is not None and outcome in ("ok", "error") and status != expected and not unparsed:
        outcome, message = "crash", f"status {status}, not {expected}: {body[:300]!r}"
    seconds = time.perf_counter() - start
    stats.outcomes[outcome] += 1
    stats.slowest_seconds = max(stats.slowest_seconds, seconds)
    if outcome in ("crash", "hang") and len(stats.findings) < 20:
        stats.findings.append(f"{case.summary}: {message}")
    assert outcome in ("ok", "error"), f"{case.summary}: {message}"


# ---- the tests ---------------------------------------------------------------------------
def test_the_page_and_an_upload_are_served(served):
    _check(served, Case(b"GET / HTTP/1.1\r\nHost: localhost\r\n\r\n", False, False, "GET /"))
    program = encode(page_program(1))
    data = (b"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\nX-Pxvm-Session: "
            + served.session.encode() + b"\r\nContent-Length: " + str(len(program)).encode()
            + b"\r\n\r\n" + program)
    status, _, body = exchange(served.port, data, False, False)
    assert status == 200 and json.loads(body)["instructions"]


@FUZZ
@given(data=st.data())
def test_fuzz_http_requests(served, data):
    _check(served, data.draw(request(served.port, served.session)))


@FUZZ
@given(body=mutated_pxi(pixels=2, ihdr=2, byte_level=2))
def test_fuzz_http_uploads(served, body):
    head = (f"POST /api/program/upload HTTP/1.1\r\nHost: localhost\r\nX-Pxvm-Session: "
            f"{served.session}\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    _check(served, Case(head + body, False, False, f"upload of {len(body)} bytes"))


@FUZZ
@given(data=st.data())
def test_fuzz_http_cross_site(served, data):
    _check(served, data.draw(cross_site_request(served.port, served.session)), expected=403)


def test_the_server_is_alive_and_within_its_bounds_at_the_end(served):
    assert served.process.poll() is None, served.stderr.read_text()[-3000:]
    status, _, body = exchange(served.port, b"GET /api/info HTTP/1.1\r\nHost: localhost\r\n"
                                            b"Connection: close\r\n\r\n", False, False)
    assert status == 200 and json.loads(body)["max_upload_pixels"] == 1 << 20
    assert served.memory_peak() < MEMORY_BYTES
    log = served.stderr.read_text()
    assert "Traceback" not in log, log[-3000:]
