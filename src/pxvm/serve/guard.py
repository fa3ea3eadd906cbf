"""The checks every HTTP request passes before the app sees it (pure ASGI middleware):

- bound to loopback, only requests addressed to loopback names (no DNS rebinding);
- no request from another site's page (Origin, Sec-Fetch-Site), as `pxvm serve`'s page;
- with an API key, /v1/ routes need `Authorization: Bearer <key>` (401 otherwise);
- a POST body needs a Content-Length within MAX_BODY and must arrive within BODY_SECONDS;
  it is read here, whole, and handed on.

Refusals are OpenAI-shaped JSON errors."""

from __future__ import annotations

import asyncio
import hmac
import json

from ..core.errors import shortened
from ..web.httpd import SAME_SITE_FETCHES, is_loopback

#: largest request body read (bytes)
MAX_BODY = 4 << 20
#: seconds a request's body may take to arrive
BODY_SECONDS = 30.0


def _error_bytes(message: str, kind: str, code: str | None = None) -> bytes:
    return json.dumps({"error": {"message": message, "type": kind, "param": None,
                                 "code": code}}).encode()


class Guard:
    def __init__(self, app, api_key: str | None = None, loopback_only: bool = True):
        self.app = app
        self.api_key = api_key
        self.loopback_only = loopback_only

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {}
        for name, value in scope.get("headers", []):
            headers.setdefault(name.decode("latin-1").lower(), []).append(value.decode("latin-1"))
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            return await _refuse(send, *refusal)
        if scope["method"] in ("POST", "PUT", "PATCH"):
            body = await self._body(headers, receive, send)
            if body is None:
                return None
            receive = _replay(body, receive)
        return await self.app(scope, receive, send)

    def _refusal(self, scope, headers) -> tuple | None:
        host = (headers.get("host") or [""])[0].strip()
        if self.loopback_only and not is_loopback(_host_name(host)):
            return 403, "this server answers only requests to localhost", "permission_error"
        origins = headers.get("origin") or []
        own = "http://" + host.lower()
        if origins and (len(origins) > 1 or origins[0].strip().lower() != own):
            return 403, (f"cross-site request refused: Origin {shortened(', '.join(origins))!r} "
                         f"is not this server's ({own})"), "permission_error"
        sites = headers.get("sec-fetch-site") or []
        if sites and (len(sites) > 1 or sites[0].strip().lower() not in SAME_SITE_FETCHES):
            return 403, (f"cross-site request refused: Sec-Fetch-Site is "
                         f"{shortened(', '.join(sites))!r}"), "permission_error"
        if self.api_key is not None and scope["path"].startswith("/v1/"):
            auth = (headers.get("authorization") or [""])[0]
            scheme, _, token = auth.partition(" ")
            if scheme.lower() != "bearer" or not hmac.compare_digest(
                    token.strip().encode("latin-1", "replace"), self.api_key.encode()):
                return (401, "a valid API key is needed: send it as the header "
                        "'Authorization: Bearer <key>'", "invalid_request_error",
                        "invalid_api_key")
        return None

    async def _body(self, headers, receive, send) -> bytes | None:
        """The whole body, or None after refusing it."""
        lengths = headers.get("content-length") or []
        text = lengths[0].strip() if len(lengths) == 1 else ""
        if headers.get("transfer-encoding") or not (text.isascii() and text.isdigit()):
            await _refuse(send, 411, "one Content-Length header with the body's size is "
                          "required (no chunked bodies)", "invalid_request_error")
            return None
        length = int(text)
        if length > MAX_BODY:
            await _refuse(send, 413, f"the body is {length:,} bytes; requests are limited to "
                          f"{MAX_BODY:,}", "invalid_request_error")
            return None
        async def read() -> bytes | None:
            parts, got = [], 0
            while True:
                message = await receive()
                if message["type"] == "http.disconnect":
                    return None
                chunk = message.get("body", b"")
                parts.append(chunk)
                got += len(chunk)
                if got > length or not message.get("more_body", False):
                    return b"".join(parts)

        try:  # asyncio.wait_for rather than asyncio.timeout: Python 3.10 has no timeout
            return await asyncio.wait_for(read(), BODY_SECONDS)
        except asyncio.TimeoutError:
            await _refuse(send, 408, f"the body did not arrive within {BODY_SECONDS:g} s",
                          "invalid_request_error")
            return None


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


async def _refuse(send, status: int, message: str, kind: str, code: str | None = None):
    body = _error_bytes(message, kind, code)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode()),
                            (b"connection", b"close")]})
    await send({"type": "http.response.body", "body": body})
