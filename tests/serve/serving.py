"""A live API server on a tiny model (numpy backend) for the tests of this folder (they
import these fixtures)."""

from __future__ import annotations

import contextlib

import pytest
from tiny_chat_model import write_tiny_chat_model

from pxvm.serve.server import HttpServer, connections_for, model_service


@contextlib.contextmanager
def live_server(model_path, **options):
    """A server for `model_path`, loaded and accepting connections; stopped after."""
    server_options = {k: options.pop(k) for k in ("api_key",) if k in options}
    service = model_service(str(model_path), backend="numpy", **options)
    connections = connections_for(options.get("max_batch", 64), options.get("max_waiting", 256))
    server = HttpServer(service, max_connections=connections, **server_options).start()
    try:
        server.load().join(120)
        assert service.ready, service.load_error
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory):
    return write_tiny_chat_model(tmp_path_factory.mktemp("serve") / "tiny-chat.gguf")


@pytest.fixture(scope="session")
def long_model(tmp_path_factory):
    """The tiny model with a context of 8,192: requests long enough that none finishes
    before a test has seen it running, however slow the machine."""
    return write_tiny_chat_model(tmp_path_factory.mktemp("serve") / "long-context.gguf",
                                 context_length=8192)


@pytest.fixture(scope="module")
def server(tiny_model):
    with live_server(tiny_model) as srv:
        yield srv


@pytest.fixture(scope="module")
def long_server(long_model):
    with live_server(long_model) as srv:
        yield srv
