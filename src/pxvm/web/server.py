"""The routes of the page `pxvm serve` serves (pxvm.serve.page answers them over HTTP):
the page (static/), the package's own kernels and example programs, and test data
computed on request (dispatch plans, numpy reference outputs, CPU executor results,
native benchmark numbers).

Nothing is served from a path built out of the request: every URL is matched against a
fixed route table and a whitelist of shipped file names, so `..`, absolute paths and
percent-encoded traversal can only ever reach a 403 or a 404.

Pages of other sites the user visits cannot make it work: /api/ requests that a browser
marks as coming from another site (Origin, Sec-Fetch-Site) get 403, and an upload or the
native benchmarks run only for requests carrying the session token that /api/info gives
(a header, which no page elsewhere can send without a CORS preflight, never granted here).

Every request is bounded: bodies and responses have a size cap, reads a time limit, and an
uploaded program is planned (validated, recorded and run on the CPU executor) in a process
of its own under a memory and a time limit, killed when the time is up or the client goes
away, while the server keeps answering others. Every refusal is a JSON error with
a status line; no request gets a 5xx unless the server has a bug.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from http import HTTPStatus
from importlib import resources

from .. import __version__
from ..backends.webgpu import webgpu_backend
from ..ops import REGISTRY
from ..core.errors import PxvmError, shortened
from ..backends.webgpu.runtime.shaders import KERNELS, load_wgsl
from ..vm import ProgramError, load_pxi
from ..vm.io import ImageTooLarge, read_png_header
from . import cases, plans
from .cases import BENCHMARKS
from .httpd import query_integer, query_text
from .weights import WeightTiles
from .uploads import PLAN_STATUS, UPLOAD_MAX_PIXELS, PlanRunner

log = logging.getLogger(__name__)

#: Largest .pxi upload accepted (bytes); larger bodies get 413 before being read.
MAX_UPLOAD = 4 * 1024 * 1024
MAX_SEED = 2**32 - 1

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
    return _shipped(resources.files(KERNELS), (".wgsl",))


def example_files() -> dict[str, object]:
    return _shipped(resources.files("pxvm.examples"), (".pxi",))


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
        except PxvmError as exc:  # the page words no remedy of the Python API's
            return {"device": None, "error": exc.reason, "results": {}}
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


class BadRequest(PxvmError):
    """A request the server cannot answer as asked (a malformed seed, say); answered 400."""


def json_answer(obj, status: int = HTTPStatus.OK) -> tuple[int, bytes, str]:
    return status, json.dumps(obj).encode(), "application/json"


def error_answer(status: int, message: str) -> tuple[int, bytes, str]:
    return json_answer({"error": message}, status)


def _file(files: dict, name: str) -> tuple[int, bytes, str]:
    if name not in files:
        return error_answer(HTTPStatus.NOT_FOUND, "not found")
    suffix = "." + name.rsplit(".", 1)[-1]
    return HTTPStatus.OK, files[name].read_bytes(), CONTENT_TYPES.get(suffix, "application/octet-stream")


def parse_seed(query: dict) -> int:
    return query_integer(query, "seed", 0, MAX_SEED, default=0)


def parse_features(query: dict) -> tuple[str, ...]:
    """The plan features `features=a,b` asks for (plans.BROWSER_FEATURES)."""
    try:
        return plans.plan_features([v for v in query_text(query, "features", "").split(",") if v])
    except ValueError as exc:
        raise BadRequest(shortened(str(exc))) from exc


def get_check(seg: list[str]) -> str | None:
    """What a GET of `seg` needs first: "token" (the session token, and from no other
    site's page), "origin" (from no other site's page) or nothing (the page's files)."""
    if seg[:1] != ["api"]:
        return None
    return "token" if seg[1:] == ["bench", "native"] else "origin"


def page_get(seg: list[str], query: dict, session: str, native: "NativeBenchmarks",
             weights: WeightTiles | None = None) -> tuple[int, bytes, str]:
    """(status, body, content type) of a GET of the path segments `seg`, matched against
    the fixed routes (get_check's checks already passed); `weights` answers the weight
    viewer's (the default model's where None)."""
    try:
        if not seg:
            return _file(static_files(), "index.html")
        if seg == ["weights"]:
            return _file(static_files(), "weights.html")
        if seg[:2] == ["api", "weights"]:
            return _weights_get(seg[2:], query, weights or WeightTiles())
        head, rest = seg[0], seg[1:]
        if head == "static" and len(rest) == 1:
            return _file(static_files(), rest[0])
        if head == "kernels" and len(rest) == 1 and rest[0] in kernel_files():
            # as the runtime compiles it: a variant file after the file it extends
            return HTTPStatus.OK, load_wgsl(rest[0]).encode(), CONTENT_TYPES[".wgsl"]
        if head == "examples" and len(rest) == 1:
            return _file(example_files(), rest[0])
        if head == "api":
            return json_answer(_api_get(rest, query, session, native))
    except KeyError as exc:
        what = exc.args[0] if exc.args else ""
        return error_answer(HTTPStatus.NOT_FOUND, f"not found: {shortened(str(what))}")
    except PxvmError as exc:
        return error_answer(HTTPStatus.BAD_REQUEST, str(exc))
    return error_answer(HTTPStatus.NOT_FOUND, "not found")


def _weights_get(rest: list[str], query: dict, weights: WeightTiles) -> tuple[int, bytes, str]:
    """The weight viewer's routes: /api/weights (the tensors), /api/weights/stats and
    /api/weights/tile (a PNG) of ?tensor=NAME."""
    if not rest:
        return json_answer(weights.listing())
    if rest == ["stats"]:
        return json_answer(weights.stats(weights.tensor(query)))
    if rest == ["tile"]:
        return HTTPStatus.OK, weights.tile_png(query), CONTENT_TYPES[".png"]
    raise KeyError("/".join(rest))


def _api_get(rest, query, session: str, native: "NativeBenchmarks"):
    route = "/".join(rest)
    if route == "info":
        return {
            "version": __version__,
            "cases": [{"id": cid, "op": cid.partition("-")[0]}
                      for cid in plans.case_ids(REGISTRY)],
            "ops_without_case": plans.ops_without_case(REGISTRY),
            "benchmarks": [n for n in BENCHMARKS if n in REGISTRY],
            "examples": sorted(example_files()),
            "kernels": sorted(kernel_files()),
            "vm": True,
            "max_upload": MAX_UPLOAD,
            "max_upload_pixels": UPLOAD_MAX_PIXELS,
            "session": session,  # for SESSION_HEADER: only this origin reads it
        }
    if len(rest) == 2 and rest[0] == "case":
        if rest[1] not in plans.case_ids(REGISTRY):
            raise KeyError(f"no conformance case {rest[1]!r}; /api/info lists them")
        return plans.conformance_plan(rest[1], parse_seed(query), parse_features(query))
    if len(rest) == 2 and rest[0] == "bench":
        if rest[1] == "native":
            return native.measure()
        if rest[1] not in BENCHMARKS or rest[1] not in REGISTRY:
            raise KeyError(f"no benchmark {rest[1]!r}; /api/info lists them")
        return plans.benchmark_plan(rest[1])
    if len(rest) == 2 and rest[0] == "program" and rest[1] == "random":
        return plans.program_plan(cases.random_program(parse_seed(query)))
    if len(rest) == 3 and rest[:2] == ["program", "example"]:
        files = example_files()
        if rest[2] not in files:
            raise KeyError(f"no example {rest[2]!r}; /api/info lists them")
        plan = plans.program_plan(load_pxi(files[rest[2]].read_bytes()))
        plan["name"] = rest[2]
        return plan
    raise KeyError(route)


UPLOAD_ROUTE = ["api", "program", "upload"]


def upload_answer(body: bytes, planner: PlanRunner, client_gone) -> tuple[int, bytes, str] | None:
    """(status, body, content type) of an upload of `body` (within MAX_UPLOAD, its
    request's checks passed): planned in a process of its own; None when the client went
    away meanwhile (the planning was stopped)."""
    try:  # the header alone decides the size, before anything is decoded
        read_png_header(body, "the upload", max_pixels=UPLOAD_MAX_PIXELS)
    except ImageTooLarge as exc:
        return error_answer(HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
                            f"{exc} in an upload (run larger programs with `pxvm run`)")
    except ProgramError as exc:
        return error_answer(HTTPStatus.BAD_REQUEST, str(exc))
    outcome, payload = planner.run(body, client_gone)
    if outcome == "gone":
        return None
    if outcome == "ok":
        return HTTPStatus.OK, payload, "application/json"
    if outcome == "bug":
        log.error("planning an upload failed:\n%s", payload)
        payload = "internal error while planning the upload (logged by the server)"
    return error_answer(PLAN_STATUS[outcome], payload)
