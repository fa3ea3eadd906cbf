"""The browser page of `pxvm serve` (pxvm.web's fixed routes: the page, its kernels and
examples, computed test data, uploads planned in a process of their own) as the ASGI
app's fallback for every path the API does not route.

What the hand-written server guaranteed still holds: only fixed routes and whitelisted
file names are served (guard.py refuses traversal-looking paths first); /api/ requests
from other sites' pages are refused (guard.py) and the upload and the native benchmarks
need the session token; bodies are bounded in size and time (guard.py), responses in
size; an upload's planning is stopped when its client goes away; every refusal is a JSON
error with a status."""

from __future__ import annotations

import asyncio
import hmac
import logging
import os
import secrets
import threading
from http import HTTPStatus
from urllib.parse import parse_qs, unquote

from starlette.concurrency import run_in_threadpool

from ..web import httpd
from ..web.httpd import SESSION_HEADER
from ..web.server import (UPLOAD_ROUTE, NativeBenchmarks, error_answer, get_check, page_get,
                          upload_answer)
from ..web.llm_routes import BrowserModels, llm_get, llm_post
from ..web.uploads import PlanRunner
from ..web.weights import WeightTiles

log = logging.getLogger("pxvm.serve")

#: the page's answers need nothing from elsewhere; this keeps it that way
CSP = ("default-src 'self'; img-src 'self' data: blob:; style-src 'self'; script-src 'self'; "
       "connect-src 'self'")
METHODS = "GET, HEAD, POST"
METHODS_TEXT = "GET, HEAD or POST"
#: the browser language model's routes (pxvm.web.llm_routes), and its file's, streamed
LLM_ROUTE = ["api", "llm"]
LLM_FILE_ROUTE = ["api", "llm", "model.gguf"]
FILE_CHUNK = 1 << 20


class Page:
    """The page's ASGI app; `session` is the token /api/info hands to the page."""

    def __init__(self, planner: PlanRunner | None = None, weights: WeightTiles | None = None,
                 llm_model: str | None = None):
        self.session = secrets.token_urlsafe(32)
        self.native = NativeBenchmarks()
        #: the weight viewer's model: `pxvm serve --model`'s, else the default one
        self.weights = weights if weights is not None else WeightTiles()
        self.planner = planner if planner is not None else PlanRunner()
        #: the language models pages run (pxvm.web.llm_routes); `llm_model` is offered first
        self.llm = BrowserModels(llm_model)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return None
        method = scope["method"]
        path = unquote(scope.get("raw_path", scope["path"].encode()).decode("latin-1"))
        seg = [s for s in path.split("/") if s]
        if method in ("GET", "HEAD") and seg == LLM_FILE_ROUTE:
            return await self._send_model_file(scope, send, head=method == "HEAD")
        if method in ("GET", "HEAD"):
            answer = await self._get(scope, seg)
        elif method == "POST":
            answer = await self._post(scope, seg, receive)
            if answer is None:  # the client went away while its upload was planned
                return None
        else:
            answer = error_answer(HTTPStatus.METHOD_NOT_ALLOWED,
                                  f"method {method[:40]!r} is not served; use {METHODS_TEXT}")
        await _send(send, *answer, head=method == "HEAD")

    async def _get(self, scope, seg):
        check = get_check(seg)
        if check == "token" and not self._has_token(scope):
            return _no_token()
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        if seg[:2] == LLM_ROUTE:
            return await run_in_threadpool(llm_get, seg[2:], self.llm)
        return await run_in_threadpool(page_get, seg, query, self.session, self.native,
                                       self.weights)

    async def _post(self, scope, seg, receive):
        if not self._has_token(scope):
            return _no_token()
        if seg[:2] == LLM_ROUTE:
            query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
            body = (await receive()).get("body", b"")  # read whole by guard.Guard
            return await run_in_threadpool(llm_post, seg[2:], query, body, self.llm)
        if seg != UPLOAD_ROUTE:
            return error_answer(HTTPStatus.NOT_FOUND, "not found")
        body = (await receive()).get("body", b"")  # read whole by guard.Guard
        gone = threading.Event()

        async def watch():
            while (await receive())["type"] != "http.disconnect":
                pass
            gone.set()

        eof = scope.get("pxvm.eof") or threading.Event()  # the client half-closed

        def client_gone() -> bool:
            return gone.is_set() or eof.is_set()

        watcher = asyncio.create_task(watch())
        try:
            return await run_in_threadpool(upload_answer, body, self.planner, client_gone)
        finally:
            watcher.cancel()

    async def _send_model_file(self, scope, send, head: bool):
        """The server's model's bytes, streamed (over MAX_RESPONSE: the page caches them)."""
        if not self._has_token(scope):
            return await _send(send, *_no_token(), head=head)
        path = self.llm.server_model()
        if path is None:
            return await _send(send, *error_answer(HTTPStatus.NOT_FOUND, "this server has no model"),
                               head=head)
        size = os.path.getsize(path)
        await send({"type": "http.response.start", "status": 200, "headers": [
            (b"content-type", b"application/octet-stream"),
            (b"content-length", str(size).encode()), (b"cache-control", b"no-store"),
            (b"x-content-type-options", b"nosniff"),
            (b"content-security-policy", CSP.encode())]})
        if head:
            return await send({"type": "http.response.body", "body": b""})
        f = await run_in_threadpool(open, path, "rb")
        try:
            while chunk := await run_in_threadpool(f.read, FILE_CHUNK):
                await send({"type": "http.response.body", "body": chunk, "more_body": True})
        finally:
            f.close()
        await send({"type": "http.response.body", "body": b""})

    def _has_token(self, scope) -> bool:
        header = SESSION_HEADER.lower().encode()
        sent = [v for k, v in scope.get("headers", []) if k.lower() == header]
        return len(sent) == 1 and hmac.compare_digest(sent[0], self.session.encode())


def _no_token():
    return error_answer(HTTPStatus.FORBIDDEN, f"cross-site request refused: the {SESSION_HEADER} "
                        "header does not carry this server's session token; use the page this "
                        "server serves")


async def _send(send, status: int, body: bytes, content_type: str, head: bool = False):
    limit = httpd.MAX_RESPONSE
    if len(body) > limit:  # nothing served is meant to come near it
        log.error("refused to send a response of %d bytes", len(body))
        status, body, content_type = error_answer(
            HTTPStatus.INTERNAL_SERVER_ERROR,
            f"the response would be {len(body):,} bytes, over the server's limit of {limit:,}")
    headers = [(b"content-type", content_type.encode()),
               (b"content-length", str(len(body)).encode()),
               (b"cache-control", b"no-store"), (b"x-content-type-options", b"nosniff"),
               (b"content-security-policy", CSP.encode())]
    if status == HTTPStatus.METHOD_NOT_ALLOWED:
        headers.append((b"allow", METHODS.encode()))
    if status == HTTPStatus.SERVICE_UNAVAILABLE:
        headers.append((b"retry-after", b"5"))
    await send({"type": "http.response.start", "status": int(status), "headers": headers})
    await send({"type": "http.response.body", "body": b"" if head else body})
