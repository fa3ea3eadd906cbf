"""The API's limits: every bad request gets its documented status in OpenAI's error shape
(and the server keeps serving), API keys, a full queue, a model still loading, clients
that go away, shutdown with streams open, and a bounded load test that loses no request
and leaks no KV block."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time

import httpx
import openai
import pytest
from openai import AsyncOpenAI, OpenAI
from serving import live_server, long_model, long_server, server, tiny_model  # noqa: F401

from pxvm.serve import guard
from pxvm.serve.server import HttpServer
from pxvm.serve.service import Service

CHAT = {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
LONG_TEXT = "the " * 300  # over the tiny model's context of 256 tokens
BAD_REQUESTS = [
    ("malformed JSON", "/v1/chat/completions", b'{"messages": [', 400, "not valid JSON"),
    ("not an object", "/v1/chat/completions", b"[1, 2]", 400, "JSON object"),
    ("unknown field", "/v1/chat/completions", {**CHAT, "frobnicate": 1}, 400, "frobnicate"),
    ("wrong type", "/v1/chat/completions", {**CHAT, "temperature": "hot"}, 400, "temperature"),
    ("bool for a number", "/v1/completions", {"prompt": "a", "max_tokens": True}, 400,
     "max_tokens"),
    ("no messages", "/v1/chat/completions", {"messages": []}, 400, "messages"),
    ("bad role", "/v1/chat/completions", {"messages": [{"role": "robot", "content": "x"}]},
     400, "role"),
    ("n of 0", "/v1/completions", {"prompt": "a", "n": 0}, 400, "n"),
    ("n over the bound", "/v1/completions", {"prompt": "a", "n": 1000}, 400, "n"),
    ("top_p of 0", "/v1/completions", {"prompt": "a", "top_p": 0}, 400, "top_p"),
    ("negative temperature", "/v1/completions", {"prompt": "a", "temperature": -1}, 400,
     "temperature"),
    ("max_tokens of 0", "/v1/completions", {"prompt": "a", "max_tokens": 0}, 400, "max_tokens"),
    ("prompt over the context", "/v1/completions", {"prompt": LONG_TEXT}, 400, "context"),
    ("max_tokens over the context", "/v1/chat/completions", {**CHAT, "max_tokens": 5000}, 400,
     "max_tokens"),
    ("token id outside the vocabulary", "/v1/completions", {"prompt": [1, 99999]}, 400,
     "vocabulary"),
    ("mixed prompt list", "/v1/completions", {"prompt": ["a", 1]}, 400, "prompt"),
    ("empty prompt", "/v1/completions", {"prompt": ""}, 400, "empty"),
    ("top_logprobs without logprobs", "/v1/chat/completions", {**CHAT, "top_logprobs": 2}, 400,
     "logprobs"),
    ("bad JSON schema", "/v1/chat/completions",
     {**CHAT, "response_format": {"type": "json_schema",
                                  "json_schema": {"name": "x", "schema": {"type": "frob"}}}},
     400, "schema"),
    ("unknown response format", "/v1/chat/completions",
     {**CHAT, "response_format": {"type": "yaml"}}, 400, "response_format"),
    ("stop list over the bound", "/v1/completions", {"prompt": "a", "stop": ["x"] * 100}, 400,
     "stop"),
]


def _post(srv, path, body, **headers):
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(srv.url + path, content=content, timeout=60,
                      headers={"content-type": "application/json", **headers})


@pytest.mark.parametrize("what,path,body,status,mentions", BAD_REQUESTS,
                         ids=[case[0] for case in BAD_REQUESTS])
def test_a_bad_request_gets_its_status_in_openais_error_shape_and_the_server_goes_on(
        server, what, path, body, status, mentions):  # noqa: F811
    r = _post(server, path, body)
    assert r.status_code == status
    error = r.json()["error"]
    assert error["type"] == "invalid_request_error" and mentions in error["message"]
    assert _post(server, "/v1/chat/completions", CHAT).status_code == 200


def test_unknown_routes_and_methods_get_404_and_405(server):  # noqa: F811
    assert httpx.get(server.url + "/v1/nothing").status_code == 404
    assert httpx.get(server.url + "/v1/completions").status_code == 405
    assert "error" in httpx.get(server.url + "/v1/nothing").json()


def test_a_body_over_the_bound_gets_413_unread(server):  # noqa: F811
    r = _post(server, "/v1/completions", b"x" * (guard.MAX_BODY + 1))
    assert r.status_code == 413 and "limited" in r.json()["error"]["message"]


def test_the_pages_model_load_takes_a_larger_body_within_its_own_bound(server):  # noqa: F811
    # a Llama 3 header (about 9 MB) is over the general bound: the load route reads it
    # and hands it on (to this API-only server's 404), not 413
    route = "/api/llm/load"
    r = _post(server, route, b"x" * (guard.MAX_BODY + (1 << 20)))
    assert r.status_code == 404
    r = _post(server, route, b"x" * (guard.LARGE_BODY_ROUTES[route] + 1))
    assert r.status_code == 413 and "32 MiB" in r.json()["error"]


def test_large_bodies_are_read_a_few_at_a_time(server):  # noqa: F811
    # clients declaring large bodies and sending them slowly hold LARGE_BODIES_AT_ONCE
    # readers; the next gets 503 at once, and a reader is free again once one leaves
    host, port = server.url.removeprefix("http://").split(":")
    head = (f"POST /api/llm/load HTTP/1.1\r\nHost: {host}:{port}\r\n"
            f"Content-Length: {8 << 20}\r\n\r\n").encode() + b"x" * 1024
    slow = [socket.create_connection((host, int(port)), timeout=10)
            for _ in range(guard.LARGE_BODIES_AT_ONCE)]
    try:
        for sock in slow:
            sock.sendall(head)
        time.sleep(0.5)
        r = _post(server, "/api/llm/load", b"x" * (guard.MAX_BODY + 1))
        assert r.status_code == 503 and "again" in r.json()["error"]
    finally:
        for sock in slow:
            sock.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        r = _post(server, "/api/llm/load", b"x" * (guard.MAX_BODY + 1))
        if r.status_code != 503:
            break
        time.sleep(0.2)
    assert r.status_code == 404


def test_a_body_without_content_length_gets_411(server):  # noqa: F811
    def chunks():
        yield json.dumps({"prompt": "a"}).encode()
    r = httpx.post(server.url + "/v1/completions", content=chunks(),
                   headers={"content-type": "application/json"})
    assert r.status_code == 411


@pytest.mark.parametrize("headers", [{"Origin": "http://evil.example"},
                                     {"Sec-Fetch-Site": "cross-site"},
                                     {"Host": "evil.example"}])
def test_requests_from_other_sites_pages_are_refused(server, headers):  # noqa: F811
    r = _post(server, "/v1/completions", {"prompt": "a"}, **headers)
    assert r.status_code == 403 and "error" in r.json()


def test_an_api_key_is_required_as_a_bearer_token_when_given(tiny_model):  # noqa: F811
    with live_server(tiny_model, api_key="sesame") as srv:
        with pytest.raises(openai.AuthenticationError) as caught:
            OpenAI(base_url=srv.url + "/v1", api_key="wrong", max_retries=0).models.list()
        assert caught.value.status_code == 401
        assert caught.value.body["code"] == "invalid_api_key"
        for headers in ({}, {"Authorization": "Basic sesame"}):
            r = _post(srv, "/v1/completions", {"prompt": "a"}, **headers)
            assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
        ok = OpenAI(base_url=srv.url + "/v1", api_key="sesame", max_retries=0)
        assert ok.completions.create(model="m", prompt="a", max_tokens=2).choices
        assert httpx.get(srv.url + "/health").status_code == 200  # probes need no key


def test_health_is_503_while_the_model_loads_and_the_api_says_so(tiny_model):  # noqa: F811
    from pxvm.llm.engine import Engine

    release = threading.Event()

    def slow_engine():
        release.wait(30)
        return Engine(str(tiny_model), backend="numpy")

    service = Service(slow_engine, "tiny")
    srv = HttpServer(service).start()
    try:
        loading = srv.load()
        r = httpx.get(srv.url + "/health")
        assert r.status_code == 503 and r.json()["status"] == "loading"
        r = _post(srv, "/v1/completions", {"prompt": "a"})
        assert r.status_code == 503 and "loading" in r.json()["error"]["message"]
        assert "Retry-After" in r.headers
        release.set()
        loading.join(60)
        assert httpx.get(srv.url + "/health").status_code == 200
    finally:
        release.set()
        srv.stop()
        service.close()


def _stream_first_chunk(srv, body):
    """A raw streaming request left open after its first event; returns the socket."""
    payload = json.dumps({**body, "stream": True}).encode()
    sock = socket.create_connection((srv.host, srv.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    got = b""
    while b"data: " not in got:
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    return sock


def _wait_idle(engine, seconds=5.0):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.running == 0 and stats.waiting == 0 and stats.kv_blocks_used == 0:
            return stats
        time.sleep(0.01)
    return engine.stats()


def test_a_client_that_goes_away_frees_its_sequence_at_once(long_server):  # noqa: F811
    server = long_server
    engine = server.service.engine
    before = engine.stats().generated_tokens_total
    sock = _stream_first_chunk(server, {"prompt": "hello", "max_tokens": 8000,
                                        "ignore_eos": True})
    sock.close()
    stats = _wait_idle(engine, 2.0)
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert stats.generated_tokens_total - before < 8000


def test_a_non_streamed_request_is_cancelled_when_its_client_goes_away(
        long_server):  # noqa: F811
    server = long_server
    engine = server.service.engine
    payload = json.dumps({"prompt": "hello", "max_tokens": 8000, "ignore_eos": True,
                          "n": 8}).encode()
    before = engine.stats().generated_tokens_total
    sock = socket.create_connection((server.host, server.port), timeout=30)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                 b"Content-Type: application/json\r\nContent-Length: "
                 + str(len(payload)).encode() + b"\r\n\r\n" + payload)
    deadline = time.monotonic() + 10
    while engine.stats().running == 0 and time.monotonic() < deadline:
        time.sleep(0.005)
    sock.close()
    stats = _wait_idle(engine, 2.0)
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
    assert stats.generated_tokens_total - before < 8 * 8000


def test_a_full_queue_answers_429_with_retry_after(long_model):  # noqa: F811
    with live_server(long_model, max_batch=1, max_waiting=1) as srv:
        running = _stream_first_chunk(srv, {"prompt": "a", "max_tokens": 8000,
                                            "ignore_eos": True})
        payload = json.dumps({"prompt": "b", "max_tokens": 8000, "ignore_eos": True,
                              "stream": True}).encode()
        queued = socket.create_connection((srv.host, srv.port), timeout=30)
        queued.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: localhost\r\n"
                       b"Content-Type: application/json\r\nContent-Length: "
                       + str(len(payload)).encode() + b"\r\n\r\n" + payload)
        deadline = time.monotonic() + 10
        while srv.service.engine.stats().waiting == 0 and time.monotonic() < deadline:
            time.sleep(0.005)
        assert srv.service.engine.stats().waiting == 1
        r = _post(srv, "/v1/completions", {"prompt": "c", "max_tokens": 2})
        running.close()
        queued.close()
        assert r.status_code == 429
        assert r.json()["error"]["type"] == "rate_limit_error"
        assert int(r.headers["Retry-After"]) >= 1
        _wait_idle(srv.service.engine)
        assert _post(srv, "/v1/completions", {"prompt": "c", "max_tokens": 2}).status_code == 200


def test_shutdown_ends_open_streams_with_a_last_chunk_and_done(long_model):  # noqa: F811
    with live_server(long_model) as srv:
        lines = []

        def read_stream():
            body = {"prompt": "a", "max_tokens": 8000, "ignore_eos": True, "stream": True}
            with httpx.stream("POST", srv.url + "/v1/completions", json=body, timeout=60) as r:
                for line in r.iter_lines():
                    if line:
                        lines.append(line)

        reader = threading.Thread(target=read_stream)
        reader.start()
        deadline = time.monotonic() + 10
        while not lines and time.monotonic() < deadline:
            time.sleep(0.005)
        srv.stop()
        reader.join(30)
    assert lines[-1] == "data: [DONE]"
    last = json.loads(lines[-2][len("data: "):])
    assert last["choices"][0]["finish_reason"] == "abort"
    assert len(lines) - 1 < 8000


def test_64_concurrent_clients_lose_no_request_and_leak_no_kv_block(tiny_model):  # noqa: F811
    seconds, clients, max_tokens = 10.0, 64, 8
    with live_server(tiny_model, max_batch=32) as srv:
        client = AsyncOpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=120)
        results = []

        async def user(k):
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline:
                stream = await client.completions.create(
                    model="m", prompt=f"user {k} says hello", max_tokens=max_tokens,
                    temperature=1.0, stream=True, stream_options={"include_usage": True},
                    extra_body={"ignore_eos": True})
                finish, usage = None, None
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].finish_reason:
                        finish = chunk.choices[0].finish_reason
                    usage = chunk.usage or usage
                results.append((finish, usage.completion_tokens if usage else None))

        async def everyone():
            await asyncio.gather(*(user(k) for k in range(clients)))
            await client.close()

        asyncio.run(everyone())
        stats = _wait_idle(srv.service.engine)
    assert len(results) >= clients
    assert all(r == ("length", max_tokens) for r in results)
    assert (stats.running, stats.waiting, stats.kv_blocks_used) == (0, 0, 0)
