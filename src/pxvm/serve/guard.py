"""The checks every HTTP request passes before the app sees it (pure ASGI middleware):

- a path that looks like traversal (`..`, `.`, backslashes, NUL, `//`, also when
  percent-encoded twice) is refused, whatever the route;
- bound to loopback, only requests addressed to loopback names (no DNS rebinding);
- /api/ and /v1/ requests and every POST from another site's page (Origin,
  Sec-Fetch-Site) are refused; the page itself may be opened from anywhere;
- with an API key, /v1/ routes need `Authorization: Bearer <key>` (401 otherwise);
- a POST body needs one Content-Length within MAX_BODY (LARGE_BODY_ROUTES' within
  theirs, LARGE_BODIES_AT_ONCE of those read at a time) and must arrive within
  BODY_SECONDS; it is read here, whole, and handed on.

Refusals are JSON errors: OpenAI's shape on /v1/ routes, the page's ({"error": text})
elsewhere."""

from __future__ import annotations

import asyncio
import hmac
import json
from urllib.parse import unquote

from ..core.errors import shortened
from ..web import httpd
from ..web.httpd import SAME_SITE_FETCHES, is_loopback

#: largest request body read (bytes): the page's uploads are limited to as much
MAX_BODY = 4 << 20
#: routes taking larger bodies, and how large: the browser page's model load sends a
#: GGUF header and the model's vectors (Llama 3's 128,256 tokens and 280,147 merges come
#: to about 7 MB by their counts)
LARGE_BODY_ROUTES = {"/api/llm/load": 32 << 20}
#: large bodies read at a time at most (others are answered 503): they bound the memory
#: held by bodies in flight to this many of them
LARGE_BODIES_AT_ONCE = 2
#: seconds a request's body may take to arrive
BODY_SECONDS = 20.0
#: path prefixes whose requests do work (and are refused from other sites' pages)
_WORK_PREFIXES = ("/api/", "/v1/")


class Refusal(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error",
                 code: str | None = None):
        super().__init__(message)
        self.status, self.message, self.kind, self.code = status, message, kind, code


def _is_work(path: str) -> bool:
    return path.startswith(_WORK_PREFIXES) or path in ("/api", "/v1")


class Guard:
    def __init__(self, app, api_key: str | None = None, loopback_only: bool = True):
        self.app = app
        self.api_key = api_key
        self.loopback_only = loopback_only
        self.large_bodies = 0  # LARGE_BODY_ROUTES' bodies being read (one event loop)

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        openai_shape = scope["path"].startswith("/v1")
        headers: dict[str, list[str]] = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        try:
            self._check(scope, headers)
            if scope["method"] in ("POST", "PUT", "PATCH"):
                body = await self._body(scope["path"], headers, receive)
                if body is None:  # the client has gone
                    return None
                receive = _replay(body, receive)
        except Refusal as refusal:
            return await _refuse(send, refusal, openai_shape)
        return await self.app(scope, receive, send)

    async def _body(self, path: str, headers, receive) -> bytes | None:
        """_body within the route's bound; a large route's while fewer than
        LARGE_BODIES_AT_ONCE others are read."""
        limit = LARGE_BODY_ROUTES.get(path)
        if limit is None:
            return await _body(headers, receive, MAX_BODY)
        if self.large_bodies >= LARGE_BODIES_AT_ONCE:
            raise Refusal(503, f"{LARGE_BODIES_AT_ONCE} large requests are being read; "
                          "send this one again when they are done")
        self.large_bodies += 1
        try:
            return await _body(headers, receive, limit)
        finally:
            self.large_bodies -= 1

    def _check(self, scope, headers) -> None:
        raw = scope.get("raw_path") or scope["path"].encode()
        twice = unquote(unquote(raw.decode("latin-1")))  # %252e%252e is caught too
        if (not raw.startswith(b"/") or raw.startswith(b"//") or "\\" in twice
                or "\x00" in twice or any(seg in ("..", ".") for seg in twice.split("/"))):
            raise Refusal(403, "path refused", "permission_error")
        host = (headers.get("host") or [""])[0].strip()
        if self.loopback_only and not is_loopback(_host_name(host)):
            raise Refusal(403, "this server answers only requests to localhost",
                          "permission_error")
        if _is_work(scope["path"]) or scope["method"] == "POST":
            why = _cross_site(headers, host)
            if why is not None:
                raise Refusal(403, f"cross-site request refused: {why}; use the page this "
                              "server serves, or a client that is not a browser",
                              "permission_error")
        if self.api_key is not None and scope["path"].startswith("/v1/"):
            auth = (headers.get("authorization") or [""])[0]
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    token.strip().encode("latin-1", "replace"), self.api_key.encode()):
                raise Refusal(401, "a valid API key is needed: send it as the header "
                              "'Authorization: Bearer <key>'", code="invalid_api_key")


def _cross_site(headers, host: str) -> str | None:
    """Why the request comes from another site's page, or None: a browser names the
    page's origin in Origin and how it relates to ours in Sec-Fetch-Site (clients that
    are not browsers send neither)."""
    origins = headers.get("origin") or []
    own = "http://" + host.lower()
    if origins and (len(origins) > 1 or origins[0].strip().lower() != own):
        return f"Origin {shortened(', '.join(origins))!r} is not this server's ({own})"
    sites = headers.get("sec-fetch-site") or []
    if sites and (len(sites) > 1 or sites[0].strip().lower() not in SAME_SITE_FETCHES):
        return f"Sec-Fetch-Site is {shortened(', '.join(sites))!r}"
    return None


async def _body(headers, receive, limit: int) -> bytes | None:
    """The whole body (None: the client went away); Refusal when it is not acceptable or
    over `limit` bytes."""
    if headers.get("transfer-encoding"):
        raise Refusal(411, "chunked bodies are not accepted; send the body with a "
                      "Content-Length")
    lengths = headers.get("content-length") or []
    text = lengths[0].strip() if len(lengths) == 1 else ""
    if not (text.isascii() and text.isdigit()) or len(text) > 18:
        raise Refusal(411, "one Content-Length header with the body's size in bytes is "
                      "required")
    length = int(text)
    too_large = Refusal(413, f"the body is {length:,} bytes; uploads and requests are "
                        f"limited to {limit >> 20} MiB")
    # a modest excess is read and dropped so the client sees the 413 instead of a reset
    # connection; anything larger is refused unread
    if length > max(limit, httpd.DRAIN_LIMIT):
        raise too_large
    got = bytearray()

    async def read() -> bool:
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return False
            if len(got) <= limit:
                got.extend(message.get("body", b""))
            if not message.get("more_body", False):
                return True

    try:  # asyncio.wait_for rather than asyncio.timeout: Python 3.10 has no timeout
        arrived = await asyncio.wait_for(read(), BODY_SECONDS)
    except asyncio.TimeoutError:
        raise Refusal(408, f"the body did not arrive within {BODY_SECONDS:g} s: "
                      f"{len(got):,} of the {length:,} bytes its Content-Length "
                      "declares") from None
    if not arrived:
        return None
    if length > limit:
        raise too_large
    if len(got) != length:
        raise Refusal(400, f"the body ended: {len(got):,} of the {length:,} bytes its "
                      "Content-Length declares")
    return bytes(got)


def _host_name(host: str) -> str:
    if host.startswith("["):
        return host[1:host.find("]")] if "]" in host else host
    return host.rsplit(":", 1)[0]


def _replay(body: bytes, receive):
    """A receive that gives the app the body read already, then the client's own events
    (its disconnect)."""
    sent = False

    async def replayed():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return replayed


async def _refuse(send, refusal: Refusal, openai_shape: bool):
    if openai_shape:
        error = {"error": {"message": refusal.message, "type": refusal.kind, "param": None,
                           "code": refusal.code}}
    else:
        error = {"error": refusal.message}
    body = json.dumps(error).encode()
    await send({"type": "http.response.start", "status": refusal.status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"cache-control", b"no-store"),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
