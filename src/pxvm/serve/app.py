"""The OpenAI-compatible API as an ASGI app (FastAPI): /v1/chat/completions,
/v1/completions (streamed as server-sent events ending in `data: [DONE]`, or whole),
/v1/models, /health and /metrics.

Every refusal is OpenAI's error shape ({"error": {"message", "type", "param", "code"}})
with a 4xx status: malformed JSON, wrong types, unknown fields and values out of range
400, a missing or wrong API key 401, a full queue 429 with Retry-After, a model still
loading 503. A client that goes away cancels its sequences at once."""

from __future__ import annotations

import asyncio
import json
import logging
import time
import uuid
from typing import AsyncIterator

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from ..core.errors import shortened
from ..llm.chat import ChatTemplateError
from ..llm.engine import QueueFullError
from ..llm.sampling import SamplingParams
from ..llm.tokenizer import TokenizerError
from .grammar import GrammarError
from .guard import Guard
from .schemas import ChatCompletionRequest, CompletionRequest, ResponseFormat
from .sequences import Piece
from .service import Job, RequestError, Run, Service

log = logging.getLogger("pxvm.serve")

#: max_tokens of a completion that names none (OpenAI's default for /v1/completions)
COMPLETION_DEFAULT_MAX_TOKENS = 16
#: seconds a client is asked to wait after a 429 or a 503
RETRY_AFTER = 1


def error_response(status: int, message: str, kind: str = "invalid_request_error",
                   param: str | None = None, code: str | None = None,
                   headers: dict | None = None) -> JSONResponse:
    return JSONResponse({"error": {"message": message, "type": kind, "param": param,
                                   "code": code}}, status_code=status, headers=headers)


_TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    if not errors:
        return "the request body is not valid", None
    first = errors[0]
    # union members add their type to the location ("prompt.list[str]"): not the client's
    loc = [str(p) for p in first.get("loc", ())
           if p != "body" and not (isinstance(p, str) and ("[" in p or p in _TYPE_TAGS))]
    if first.get("type") == "json_invalid":
        return "the request body is not valid JSON: " + str(first.get("msg", "")), None
    if not loc and first.get("type") in ("model_attributes_type", "dict_type"):
        return ("the request body must be a JSON object, sent as Content-Type: "
                "application/json"), None
    where = ".".join(loc) or "the body"
    if first.get("type") == "extra_forbidden":
        message = f"unknown field {where!r}; remove it"
    else:
        message = f"{where}: {first.get('msg', 'invalid value')}"
    more = f" (and {len(errors) - 1} more problems)" if len(errors) > 1 else ""
    return shortened(message, 300) + more, ".".join(loc) or None


def create_app(service: Service | None, page=None, *, api_key: str | None = None,
               loopback_only: bool = True, replicas=None) -> FastAPI:
    """The app: the OpenAI API for `service`'s model (when given) and the browser `page`
    (a pxvm.serve.page.Page, when given) for every path the API does not route.
    `replicas`, where this app is one replica of several (pxvm.serve.cluster), answers
    /health and /metrics for them all: its async health() gives the JSON of a ready
    replica's /health, its async metrics() the Prometheus text."""
    app = FastAPI(title="pxvm", docs_url=None, redoc_url=None, openapi_url=None)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, param=param)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request, exc: StarletteHTTPException):
        kind = "not_found_error" if exc.status_code == 404 else "invalid_request_error"
        return error_response(exc.status_code, str(exc.detail), kind,
                              headers=getattr(exc, "headers", None))

    @app.exception_handler(Exception)
    async def _bug(request, exc: Exception):
        log.error("error answering %s", request.url.path, exc_info=exc)
        return error_response(500, "internal error (logged by the server)", "server_error")

    if service is not None:
        _add_api(app, service, replicas)
    if page is not None:
        async def fallback(scope, receive, send):  # /v1/ paths the API lacks: its own 404
            if scope["path"].startswith("/v1"):
                return await app.router.not_found(scope, receive, send)
            return await page(scope, receive, send)
        app.router.default = fallback
    app.add_middleware(Guard, api_key=api_key, loopback_only=loopback_only)
    return app


def _add_api(app: FastAPI, service: Service, replicas=None) -> None:
    @app.get("/health")
    async def health():
        if service.ready:
            return {"status": "ok"} if replicas is None else await replicas.health()
        if service.load_error:
            return error_response(503, f"the model failed to load: {service.load_error}",
                                  "service_unavailable")
        return JSONResponse({"status": "loading"}, status_code=503,
                            headers={"Retry-After": str(RETRY_AFTER)})

    @app.get("/metrics")
    async def metrics():
        text = service.metrics.render() if replicas is None else await replicas.metrics()
        return Response(text,
                        media_type="text/plain; version=0.0.4; charset=utf-8")

    @app.get("/v1/models")
    async def models():
        data = [{"id": service.model_id, "object": "model", "created": service.created,
                 "owned_by": "pxvm"}]
        if service.ready:
            data[0]["max_model_len"] = service.context_length
        return {"object": "list", "data": data}

    @app.post("/v1/chat/completions")
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        return await _answer(service, request, body, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        return await _answer(service, request, body, chat=False)


# ---- building jobs ---------------------------------------------------------------------
def _constraint(service: Service, fmt: ResponseFormat | None):
    """A maker of logits processors for `fmt`, or None; the schema is compiled once here,
    so that a bad one is refused before anything is queued."""
    if fmt is None or fmt.type == "text":
        return None
    schema = None
    if fmt.type == "json_schema":
        if fmt.json_schema is None or fmt.json_schema.json_schema is None:
            raise RequestError("response_format json_schema needs json_schema.schema",
                               "response_format")
        schema = fmt.json_schema.json_schema
    service.grammars.processor(schema)  # raises GrammarError for a schema it cannot use
    return lambda: service.grammars.processor(schema)


def _sampling(body) -> SamplingParams:
    return SamplingParams(temperature=1.0 if body.temperature is None else body.temperature,
                          top_p=1.0 if body.top_p is None else body.top_p,
                          top_k=body.top_k or 0, seed=body.seed)


def _chat_job(service: Service, body: ChatCompletionRequest) -> Job:
    ids = service.chat_ids([m.template_dict() for m in body.messages])
    logprobs = (body.top_logprobs or 0) if body.logprobs else None
    if body.top_logprobs and not body.logprobs:
        raise RequestError("top_logprobs needs logprobs: true", "top_logprobs")
    limit = body.token_limit()
    if limit == 0:
        raise RequestError("max_tokens must be at least 1", "max_tokens")
    return Job([service.prompt(ids, limit, None)], body.n, _sampling(body),
               body.stop_strings(), body.ignore_eos, logprobs,
               _constraint(service, body.response_format))


def _completion_job(service: Service, body: CompletionRequest) -> Job:
    if body.max_tokens == 0:
        raise RequestError("max_tokens must be at least 1 (echo is not served)", "max_tokens")
    prompts = []
    for p in body.prompts():
        ids = service.check_ids(list(p)) if isinstance(p, list) else service.text_ids(p)
        prompts.append(service.prompt(ids, body.max_tokens, COMPLETION_DEFAULT_MAX_TOKENS))
    return Job(prompts, body.n, _sampling(body), body.stop_strings(), body.ignore_eos,
               body.logprobs, _constraint(service, body.response_format))


async def _answer(service: Service, request: Request, body, chat: bool):
    if not service.ready:
        if service.load_error:
            return error_response(503, f"the model failed to load: {service.load_error}",
                                  "service_unavailable")
        return error_response(503, "the model is still loading; try again in a moment",
                              "service_unavailable", headers={"Retry-After": str(RETRY_AFTER)})
    try:
        job = _chat_job(service, body) if chat else _completion_job(service, body)
        run = service.run(job)
    except RequestError as exc:
        return error_response(400, str(exc), param=exc.param)
    except (ChatTemplateError, TokenizerError, GrammarError) as exc:
        return error_response(400, str(exc))
    except ValueError as exc:  # SamplingParams' own checks
        return error_response(400, str(exc))
    except QueueFullError as exc:
        return error_response(429, f"the server is busy: {exc}; try again in a moment",
                              "rate_limit_error", headers={"Retry-After": str(RETRY_AFTER)})
    fmt = _ChatFormat(service, body) if chat else _CompletionFormat(service, body)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(_sse(run, fmt, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-store"})
    return await _whole(run, fmt, request)


async def _whole(run: Run, fmt, request: Request):
    """The whole answer; a client that disconnects meanwhile cancels the run at once."""
    async def collect():
        async for piece in run.pieces():
            fmt.add(piece)

    async def gone():
        while (await request.receive())["type"] != "http.disconnect":
            pass

    work, watch = asyncio.create_task(collect()), asyncio.create_task(gone())
    try:
        done, _ = await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        watch.cancel()
        if not work.done():
            work.cancel()
            run.cancel()
    if work not in done:
        return Response(status_code=499)  # nobody reads it
    work.result()
    errors = [c.error for c in run.choices if c.finish_reason == "error"]
    if errors:
        return error_response(500, f"generation failed: {errors[0]}", "server_error")
    return fmt.whole(run)


async def _sse(run: Run, fmt, include_usage: bool) -> AsyncIterator[str]:
    async for piece in run.pieces():
        yield _event(fmt.chunk(piece))
    if include_usage:
        yield _event(fmt.usage_chunk(run.usage()))
    yield "data: [DONE]\n\n"


def _event(obj: dict) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False)}\n\n"


# ---- answers in OpenAI's shapes ----------------------------------------------------------
class _Format:
    object_whole = object_chunk = ""

    def __init__(self, service: Service, body):
        self.service = service
        self.tokenizer = service.tokenizer
        self.id = self.prefix + uuid.uuid4().hex
        self.created = int(time.time())
        self.model = service.model_id
        self.texts: dict[int, list[str]] = {}
        self.logprobs: dict[int, list] = {}
        self.finish: dict[int, str] = {}

    def add(self, piece: Piece) -> None:
        self.texts.setdefault(piece.index, []).append(piece.text)
        self.logprobs.setdefault(piece.index, []).extend(piece.tokens)
        if piece.finish_reason is not None:
            self.finish[piece.index] = piece.finish_reason

    def _head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def token_text(self, token_id: int) -> str:
        return self.tokenizer.decode([token_id])

    def usage_chunk(self, usage: dict) -> dict:
        return {**self._head(self.object_chunk), "choices": [], "usage": usage}


class _ChatFormat(_Format):
    prefix = "chatcmpl-"
    object_whole, object_chunk = "chat.completion", "chat.completion.chunk"

    def __init__(self, service: Service, body: ChatCompletionRequest):
        super().__init__(service, body)
        self.want_logprobs = body.logprobs
        self.started: set[int] = set()

    def _entry(self, token_id: int, logprob: float | None) -> dict:
        text = self.token_text(token_id)
        return {"token": text, "logprob": logprob, "bytes": list(text.encode("utf-8"))}

    def _logprobs(self, tokens) -> dict | None:
        if not self.want_logprobs:
            return None
        return {"content": [{**self._entry(t.token_id, t.logprob),
                             "top_logprobs": [self._entry(i, lp) for i, lp in t.top_logprobs]}
                            for t in tokens]}

    def chunk(self, piece: Piece) -> dict:
        delta = {"content": piece.text} if piece.text or piece.finish_reason is None else {}
        if piece.index not in self.started:
            self.started.add(piece.index)
            delta = {"role": "assistant", "content": piece.text}
        return {**self._head(self.object_chunk),
                "choices": [{"index": piece.index, "delta": delta,
                             "logprobs": self._logprobs(piece.tokens),
                             "finish_reason": piece.finish_reason}]}

    def whole(self, run: Run) -> dict:
        choices = [{"index": i,
                    "message": {"role": "assistant", "content": "".join(self.texts.get(i, []))},
                    "logprobs": self._logprobs(self.logprobs.get(i, [])),
                    "finish_reason": self.finish.get(i)}
                   for i in range(len(run.choices))]
        return {**self._head(self.object_whole), "choices": choices, "usage": run.usage()}


class _CompletionFormat(_Format):
    prefix = "cmpl-"
    object_whole = object_chunk = "text_completion"

    def __init__(self, service: Service, body: CompletionRequest):
        super().__init__(service, body)
        self.want_logprobs = body.logprobs is not None
        self.offsets: dict[int, int] = {}

    def _logprobs(self, index: int, tokens) -> dict | None:
        if not self.want_logprobs:
            return None
        out = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        offset = self.offsets.get(index, 0)
        for t in tokens:
            text = self.token_text(t.token_id)
            out["tokens"].append(text)
            out["token_logprobs"].append(t.logprob)
            out["top_logprobs"].append({self.token_text(i): lp for i, lp in t.top_logprobs})
            out["text_offset"].append(offset)
            offset += len(text)
        self.offsets[index] = offset
        return out

    def chunk(self, piece: Piece) -> dict:
        return {**self._head(self.object_chunk),
                "choices": [{"index": piece.index, "text": piece.text,
                             "logprobs": self._logprobs(piece.index, piece.tokens),
                             "finish_reason": piece.finish_reason}]}

    def whole(self, run: Run) -> dict:
        choices = [{"index": i, "text": "".join(self.texts.get(i, [])),
                    "logprobs": self._logprobs(i, self.logprobs.get(i, [])),
                    "finish_reason": self.finish.get(i)}
                   for i in range(len(run.choices))]
        return {**self._head(self.object_whole), "choices": choices, "usage": run.usage()}
