"""Running the app under uvicorn: the model loads in a thread while the server already
answers (/health says "loading"); on shutdown the engine ends every open request first,
so streams in flight end with a last chunk and `data: [DONE]` instead of a cut connection.

Connections are bounded as the hand-written page server bounded them: at most
`max_connections` at once (uvicorn answers more with 503), and each request's headers
must arrive within HEADER_SECONDS (uvicorn itself times out only idle kept-alive
connections, so a client trickling its headers would keep its connection for ever)."""

from __future__ import annotations

import asyncio
import json
import logging
import socket
import threading
import time

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol

from ..llm.engine import Engine
from ..web import httpd
from .app import create_app
from .page import Page
from .service import Service, default_model_id

log = logging.getLogger("pxvm.serve")

#: seconds open connections get to finish once the engine has ended their requests
GRACEFUL_SECONDS = 5


class _BoundedH11(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with the hand-written page server's bounds: past
    `max_connections` open connections a new one is answered 503 at once and closed; a
    connection whose next request's headers have not arrived within HEADER_SECONDS is
    closed (uvicorn times out only idle kept-alive ones, so a client trickling its
    headers would keep its connection for ever); a client of the page that half-closes
    after its request still gets the answer (uvicorn would drop it), and one that does so
    while its upload is planned stops the planning (scope["pxvm.eof"]); an API client
    that closes is gone, its request cancelled at once; malformed requests get
    a JSON error as every other refusal."""

    max_connections = httpd.MAX_CONNECTIONS

    def connection_made(self, transport) -> None:
        super().connection_made(transport)
        self._deadline = None
        if len(self.connections) > self.max_connections:
            transport.write(httpd.BUSY_RESPONSE)
            transport.close()
            return
        self._arm()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and "pxvm.eof" not in self.scope:
            self.scope["pxvm.eof"] = threading.Event()

    def eof_received(self) -> bool:
        if self.cycle is None or self.cycle.response_complete:
            return False  # nothing to answer: close
        if self.scope["path"].startswith("/v1/"):
            return False  # API clients never half-close: gone, so its sequences end at once
        self.scope["pxvm.eof"].set()
        if self.conn.their_state == h11.SEND_BODY:  # the rest of its body will never come:
            self.cycle.more_body = False           # the app sees it end short (400) now
            self.cycle.message_event.set()
        return True  # keep our side open for the answer (on_response_complete closes it)

    def on_response_complete(self) -> None:
        half_closed = self.scope.get("pxvm.eof") is not None and self.scope["pxvm.eof"].is_set()
        super().on_response_complete()
        if half_closed:  # no request can follow: free the connection's slot now
            self.transport.close()
            return
        self._arm()

    def connection_lost(self, exc) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        super().connection_lost(exc)

    def _arm(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
        self._deadline = self.loop.call_later(httpd.HEADER_SECONDS, self._headers_late)

    def _headers_late(self) -> None:
        waiting = self.cycle is None or self.cycle.response_complete
        if waiting and not self.transport.is_closing():
            self.transport.close()

    def send_400_response(self, msg: str) -> None:
        if self.cycle is not None and not self.cycle.response_complete:
            # malformed bytes after a request's head (a broken chunk, a pipelined line):
            # its body ends here and the app answers it, on a connection that then closes
            self.cycle.more_body = False
            self.cycle.keep_alive = False
            self.cycle.message_event.set()
            return
        body = json.dumps({"error": f"malformed request ({msg.rstrip('.')}); send HTTP/1.1 "
                                    "with one Content-Length for a body"}).encode()
        response = h11.Response(status_code=400, reason=b"Bad Request", headers=[
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()), (b"connection", b"close")])
        try:
            for event in (response, h11.Data(data=body), h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
        except h11.LocalProtocolError:  # bytes after an answer that closes: nothing to say
            pass
        self.transport.close()


class _Server(uvicorn.Server):
    """uvicorn's server that stops the engine before waiting for open connections."""

    def __init__(self, config: uvicorn.Config, service: Service | None):
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets=None) -> None:
        if self.service is not None:
            await asyncio.to_thread(self.service.close)
        await super().shutdown(sockets)


class HttpServer:
    """`pxvm serve` on (host, port): the browser page and, for a `service`, its model's
    OpenAI API; run by `serve_forever` (the CLI) or in a thread (`start`, for tests and
    `pxvm bench serve`)."""

    def __init__(self, service: Service | None, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, loopback_only: bool = True,
                 page: Page | None = None, max_connections: int = httpd.MAX_CONNECTIONS,
                 log_level: str = "warning"):
        self.service = service
        self.page = page
        self.sock = _listen(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        app = create_app(service, page, api_key=api_key, loopback_only=loopback_only)
        protocol = type("BoundedH11", (_BoundedH11,), {"max_connections": max_connections})
        config = uvicorn.Config(app, log_level=log_level, access_log=False, http=protocol,
                                timeout_graceful_shutdown=GRACEFUL_SECONDS, lifespan="off")
        self.server = _Server(config, service)
        self.thread: threading.Thread | None = None

    @property
    def server_address(self) -> tuple:
        return self.host, self.port

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}"

    @property
    def session(self) -> str | None:
        """The page's session token (None without the page)."""
        return self.page.session if self.page is not None else None

    def load(self) -> threading.Thread:
        """Load the model in a thread of its own; returns it."""
        thread = threading.Thread(target=self.service.load, name="pxvm-load", daemon=True)
        thread.start()
        return thread

    def serve_forever(self) -> None:
        """Serve until Ctrl-C / SIGTERM (uvicorn's handlers), then shut down."""
        self.server.run(sockets=[self.sock])

    def start(self, timeout: float = 30.0) -> "HttpServer":
        """Serve from a thread; returns once it accepts connections."""
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]},
                                       name="pxvm-serve", daemon=True)
        self.server.config.install_signal_handlers = False  # not the main thread
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"the server on {self.url} did not start")
            time.sleep(0.02)
        return self

    def stop(self, timeout: float = 30.0) -> None:
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout)
        self.sock.close()


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def connections_for(max_batch: int, max_waiting: int) -> int:
    """Connections a model's server takes at once: every running and waiting request's,
    and the page's."""
    return max_batch + max_waiting + httpd.MAX_CONNECTIONS


def model_service(path: str, backend: str = "auto", max_batch: int = 64,
                  max_waiting: int = 256, kv_blocks: int | None = None,
                  model_id: str | None = None) -> Service:
    """A service for the GGUF file at `path` (not loaded yet: Service.load)."""
    return Service(lambda: Engine(path, backend=backend, max_batch=max_batch,
                                  max_waiting=max_waiting, kv_blocks=kv_blocks),
                   model_id or default_model_id(path), source=path)
