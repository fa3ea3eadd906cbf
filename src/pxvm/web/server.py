"""The local web server behind `pxvm serve`: the page (static/), the package's own kernels
and example programs, and test data computed on request (dispatch plans, numpy reference
outputs, CPU executor results, native benchmark numbers).

Nothing is served from a path built out of the request: every URL is matched against a
fixed route table and a whitelist of shipped file names, so `..`, absolute paths and
percent-encoded traversal can only ever reach a 403 or a 404.
"""

from __future__ import annotations

import ipaddress
import json
import logging
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from urllib.parse import parse_qs, unquote, urlsplit

from .. import __version__
from ..backends import webgpu_backend
from ..ops import REGISTRY
from ..runtime.errors import PxvmError
from ..vm import load_pxi
from . import cases, plans
from .cases import BENCHMARKS

log = logging.getLogger(__name__)

#: Largest .pxi upload accepted (bytes); larger bodies get 413 before being read.
MAX_UPLOAD = 4 * 1024 * 1024
#: Oversized bodies up to this size are drained before the 413, larger ones are not read.
DRAIN_LIMIT = 4 * MAX_UPLOAD
DEFAULT_HOST = "127.0.0.1"

CONTENT_TYPES = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".wgsl": "text/plain; charset=utf-8",
    ".pxi": "image/png",
    ".png": "image/png",
    ".svg": "image/svg+xml",
    ".json": "application/json",
}


def _shipped(root, suffixes: tuple[str, ...]) -> dict[str, object]:
    """name -> resource of the files shipped in `root` with one of `suffixes` (no folders)."""
    return {p.name: p for p in root.iterdir()
            if p.is_file() and p.name.endswith(suffixes) and not p.name.startswith(".")}


def static_files() -> dict[str, object]:
    return _shipped(resources.files("pxvm.web").joinpath("static"), (".html", ".js", ".css", ".svg", ".png"))


def kernel_files() -> dict[str, object]:
    return _shipped(resources.files("pxvm.kernels"), (".wgsl",))


def example_files() -> dict[str, object]:
    return _shipped(resources.files("pxvm.examples"), (".pxi",))


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or the name localhost) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class NativeBenchmarks:
    """Runs the benchmark cases through pxvm's own WebGPU backend, once, on request."""

    def __init__(self):
        self._lock = threading.Lock()
        self._result: dict | None = None

    def measure(self, reps: int = 5) -> dict:
        with self._lock:
            if self._result is None:
                self._result = self._measure(reps)
            return self._result

    def _measure(self, reps: int) -> dict:
        try:
            backend = webgpu_backend()
        except PxvmError as exc:
            return {"device": None, "error": str(exc), "results": {}}
        results = {}
        for name in BENCHMARKS:
            if name not in REGISTRY:
                continue
            inputs, case = plans.benchmark_inputs(name)
            tensors = [backend.from_numpy(x) for x in inputs]
            op = REGISTRY[name]
            op(*tensors, backend=backend, **case.params)  # compile and warm the pool
            backend.device.wait()
            start = time.perf_counter()
            for _ in range(reps):
                op(*tensors, backend=backend, **case.params)
            backend.device.wait()
            seconds = (time.perf_counter() - start) / reps
            results[name] = {"seconds": seconds,
                             "gflops": case.flops(inputs) / seconds / 1e9,
                             "gbs": case.bytes_moved(inputs) / seconds / 1e9}
        return {"device": backend.describe(), "error": None, "results": results}


class PxvmRequestHandler(BaseHTTPRequestHandler):
    server_version = f"pxvm/{__version__}"
    protocol_version = "HTTP/1.1"

    # ---- plumbing ------------------------------------------------------------------
    def log_message(self, fmt, *args):
        log.info("%s %s", self.address_string(), fmt % args)

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8"):
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        # the page needs nothing from elsewhere; this keeps it that way
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
                         "script-src 'self'; connect-src 'self'")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _discard(self, length: int) -> None:
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)

    def _json(self, obj, status: int = 200):
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _error(self, status: int, message: str):
        self._json({"error": message}, status)

    def _host_allowed(self) -> bool:
        """When bound to loopback, answer only requests addressed to loopback names, so a
        web page elsewhere cannot reach this server through DNS rebinding."""
        if not is_loopback(self.server.server_address[0]):
            return True
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):
            name = host[1:host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0]
        return is_loopback(name)

    def _route(self):
        """(segments, query) of the request path, or None after refusing it."""
        if not self._host_allowed():
            self._error(HTTPStatus.FORBIDDEN, "this server answers only requests to localhost")
            return None
        parts = urlsplit(self.path)
        raw = parts.path
        path = unquote(raw)
        # decode twice so %252e%252e is caught too; any traversal-looking path is refused
        twice = unquote(path)
        if (not raw.startswith("/") or raw.startswith("//") or "\\" in twice or "\x00" in twice
                or any(seg in ("..", ".") for seg in twice.split("/"))):
            self._error(HTTPStatus.FORBIDDEN, "path refused")
            return None
        segments = [s for s in path.split("/") if s]
        return segments, parse_qs(parts.query)

    # ---- GET -----------------------------------------------------------------------
    def do_HEAD(self):
        self.do_GET()

    def do_GET(self):
        routed = self._route()
        if routed is None:
            return
        seg, query = routed
        try:
            if not seg:
                return self._file(static_files(), "index.html")
            head, rest = seg[0], seg[1:]
            if head == "static" and len(rest) == 1:
                return self._file(static_files(), rest[0])
            if head == "kernels" and len(rest) == 1:
                return self._file(kernel_files(), rest[0])
            if head == "examples" and len(rest) == 1:
                return self._file(example_files(), rest[0])
            if head == "api":
                return self._api_get(rest, query)
        except (KeyError, ValueError, IndexError) as exc:
            return self._error(HTTPStatus.NOT_FOUND, f"not found: {exc}")
        except PxvmError as exc:
            return self._error(HTTPStatus.BAD_REQUEST, str(exc))
        self._error(HTTPStatus.NOT_FOUND, "not found")

    def _file(self, files: dict, name: str):
        if name not in files:
            return self._error(HTTPStatus.NOT_FOUND, "not found")
        suffix = "." + name.rsplit(".", 1)[-1]
        self._send(200, files[name].read_bytes(), CONTENT_TYPES.get(suffix, "application/octet-stream"))

    def _seed(self, query) -> int:
        return int(query.get("seed", ["0"])[0]) % (2**32)

    def _api_get(self, rest, query):
        route = "/".join(rest)
        if route == "info":
            return self._json({
                "version": __version__,
                "cases": [{"id": cid, "op": cid.partition("-")[0]}
                          for cid in plans.case_ids(REGISTRY)],
                "ops_without_case": plans.ops_without_case(REGISTRY),
                "benchmarks": [n for n in BENCHMARKS if n in REGISTRY],
                "examples": sorted(example_files()),
                "kernels": sorted(kernel_files()),
                "vm": True,
                "max_upload": MAX_UPLOAD,
            })
        if len(rest) == 2 and rest[0] == "case":
            return self._json(plans.conformance_plan(rest[1], self._seed(query)))
        if len(rest) == 2 and rest[0] == "bench":
            if rest[1] == "native":
                return self._json(self.server.native.measure())
            if rest[1] not in BENCHMARKS:
                raise KeyError(rest[1])
            return self._json(plans.benchmark_plan(rest[1]))
        if len(rest) == 2 and rest[0] == "program" and rest[1] == "random":
            return self._json(plans.program_plan(cases.random_program(self._seed(query))))
        if len(rest) == 3 and rest[:2] == ["program", "example"]:
            files = example_files()
            if rest[2] not in files:
                raise KeyError(rest[2])
            plan = plans.program_plan(load_pxi(files[rest[2]].read_bytes()))
            plan["name"] = rest[2]
            return self._json(plan)
        raise KeyError(route)

    # ---- POST: run a dropped .pxi ----------------------------------------------------
    def do_POST(self):
        routed = self._route()
        if routed is None:
            return
        seg, _ = routed
        if seg != ["api", "program", "upload"]:
            self.close_connection = True
            return self._error(HTTPStatus.NOT_FOUND, "not found")
        try:
            length = int(self.headers.get("Content-Length", ""))
        except ValueError:
            self.close_connection = True
            return self._error(HTTPStatus.LENGTH_REQUIRED, "Content-Length is required")
        if length < 0 or length > MAX_UPLOAD:
            # a modest excess is read and dropped so the client sees the 413 instead of a
            # reset connection; anything larger is left unread and the connection closed
            if length <= DRAIN_LIMIT:
                self._discard(length)
            self.close_connection = True
            return self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                               f"uploads are limited to {MAX_UPLOAD // (1024 * 1024)} MiB")
        body = self.rfile.read(length)
        try:
            plan = plans.program_plan(load_pxi(body))
        except PxvmError as exc:
            return self._error(HTTPStatus.BAD_REQUEST, str(exc))
        plan["name"] = "uploaded program"
        self._json(plan)


class PxvmServer(ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self, address, handler=PxvmRequestHandler):
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self.native = NativeBenchmarks()

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"


def make_server(host: str = DEFAULT_HOST, port: int = 8765) -> PxvmServer:
    """A server bound to (host, port); port 0 picks a free one. Loopback by default."""
    return PxvmServer((host, port))
