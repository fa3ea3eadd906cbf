"""Running the API under uvicorn: the model loads in a thread while the server already
answers (/health says "loading"); on shutdown the engine ends every open request first,
so streams in flight end with a last chunk and `data: [DONE]` instead of a cut connection."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time

import uvicorn

from ..llm.engine import Engine
from .app import create_app
from .service import Service, default_model_id

log = logging.getLogger("pxvm.serve")

#: seconds open connections get to finish once the engine has ended their requests
GRACEFUL_SECONDS = 5


class _Server(uvicorn.Server):
    """uvicorn's server that stops the engine before waiting for open connections."""

    def __init__(self, config: uvicorn.Config, service: Service):
        super().__init__(config)
        self.service = service

    async def shutdown(self, sockets=None) -> None:
        await asyncio.to_thread(self.service.close)
        await super().shutdown(sockets)


class ApiServer:
    """The API for one model on (host, port), run by `serve_forever` (the CLI) or in a
    thread (`start`, for tests and `pxvm bench serve`)."""

    def __init__(self, service: Service, host: str = "127.0.0.1", port: int = 0,
                 api_key: str | None = None, loopback_only: bool = True,
                 log_level: str = "warning"):
        self.service = service
        self.sock = _listen(host, port)
        self.host, self.port = self.sock.getsockname()[:2]
        app = create_app(service, api_key=api_key, loopback_only=loopback_only)
        config = uvicorn.Config(app, log_level=log_level, access_log=False,
                                timeout_graceful_shutdown=GRACEFUL_SECONDS,
                                lifespan="off")
        self.server = _Server(config, service)
        self.thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        shown = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{shown}:{self.port}"

    def load(self) -> threading.Thread:
        """Load the model in a thread of its own; returns it."""
        thread = threading.Thread(target=self.service.load, name="pxvm-load", daemon=True)
        thread.start()
        return thread

    def serve_forever(self) -> None:
        """Serve until Ctrl-C / SIGTERM (uvicorn's handlers), then shut down."""
        self.server.run(sockets=[self.sock])

    def start(self, timeout: float = 30.0) -> "ApiServer":
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


def model_service(path: str, backend: str = "auto", max_batch: int = 64,
                  max_waiting: int = 256, kv_blocks: int | None = None,
                  model_id: str | None = None) -> Service:
    """A service for the GGUF file at `path` (not loaded yet: Service.load)."""
    return Service(lambda: Engine(path, backend=backend, max_batch=max_batch,
                                  max_waiting=max_waiting, kv_blocks=kv_blocks),
                   model_id or default_model_id(path), source=path)
