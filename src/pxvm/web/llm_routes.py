"""The page's language-model routes (under /api/llm/; pxvm.serve.page answers them):

- GET  info: the server's model (its name, size and the URL of its bytes) if it has one
  (`pxvm serve --model FILE`, else the default SmolLM2 where installed);
- GET  model.gguf: those bytes (streamed by pxvm.serve.page);
- POST load?size=&features=&max_binding=&software=&name=: the body is a GGUF file's header and its
  vectors (llm_plans); answers the model's id and its plan (buffers, decoding steps);
- POST prompt?model=&tokens=&position=: the plan of a prompt piece;
- POST encode?model= {"messages": [...]}: a chat's prompt token ids (the file's template
  and tokenizer, as `pxvm chat` renders and encodes them);
- POST decode?model= {"ids": [...]}: their text, control tokens left out.

Tokenization is the server's (pxvm's own tokenizer and sandboxed Jinja template, from the
header the page sent), so the page's text is exactly pxvm's; POSTs need the session token.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from http import HTTPStatus

from ..core.errors import PxvmError, shortened
from ..llm.gguf_model import default_model_path
from ..llm.gguf_scan import ModelFileError
from .llm_plans import MAX_FILE_BYTES, MODELS_KEPT, BrowserModel, BrowserModelError
from .httpd import query_integer, query_text
from .server import error_answer, json_answer, parse_features

#: The most token ids a decode request may carry, and the most messages' characters.
MAX_IDS = 1 << 16
MAX_CHAT_CHARS = 1 << 20
#: The smallest binding size a page may ask plans for (WebGPU's guaranteed default is
#: 128 MiB; smaller only in tests).
MIN_BINDING = 1 << 20


class BrowserModels:
    """The models pages asked for, recorded (the MODELS_KEPT most recent), and the
    server's own model file."""

    def __init__(self, server_model: str | None = None):
        self._server_model = server_model
        self._lock = threading.Lock()
        self._loading = threading.Lock()
        self._models: OrderedDict[str, BrowserModel] = OrderedDict()

    def server_model(self) -> str | None:
        """The path of the model the page offers first; None where there is none."""
        if self._server_model is None:
            try:
                self._server_model = default_model_path()
            except ModelFileError:
                return None
        return self._server_model

    def info(self) -> dict:
        path = self.server_model()
        if path is None or not os.path.isfile(path):
            return {"server_model": None}
        stat = os.stat(path)
        return {"server_model": {"name": os.path.basename(path), "size": stat.st_size,
                                 "url": "/api/llm/model.gguf",
                                 "version": f"{stat.st_size}-{int(stat.st_mtime)}"}}

    def load(self, body: bytes, query: dict) -> dict:
        size = query_integer(query, "size", 1, MAX_FILE_BYTES)
        binding = query_integer(query, "max_binding", MIN_BINDING, 1 << 40)
        features = parse_features(query)
        name = shortened(query_text(query, "name", "") or "the model", 80)
        software = query_integer(query, "software", 0, 1, default=0) == 1
        key = hashlib.sha256(body + f"|{size}|{binding}|{features}|{software}".encode()
                             ).hexdigest()[:24]
        with self._lock:
            model = self._models.get(key)
        if model is None:
            with self._loading:  # one skeleton on disk at a time
                model = BrowserModel(body, size, name, features, binding, software)
            with self._lock:
                self._models[key] = model
                while len(self._models) > MODELS_KEPT:
                    self._models.popitem(last=False)
        with self._lock:
            self._models.move_to_end(key)
        return {"model": key, **model.plan()}

    def get(self, query: dict) -> BrowserModel:
        key = query_text(query, "model", "")
        with self._lock:
            model = self._models.get(key)
        if model is None:
            raise KeyError("no such model loaded (the server keeps the last "
                           f"{MODELS_KEPT}); load it again")
        return model


def _body_json(body: bytes) -> dict:
    try:
        value = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise BrowserModelError(f"the body is not JSON: {shortened(str(exc), 80)}") from exc
    if not isinstance(value, dict):
        raise BrowserModelError("the body must be a JSON object")
    return value


def _messages(value) -> list[dict]:
    ok = isinstance(value, list) and value and all(
        isinstance(m, dict) and set(m) == {"role", "content"} and isinstance(m["role"], str)
        and isinstance(m["content"], str) for m in value)
    if not ok:
        raise BrowserModelError('messages must be a list of {"role": .., "content": ..}')
    if sum(len(m["content"]) for m in value) > MAX_CHAT_CHARS:
        raise BrowserModelError(f"the messages are over {MAX_CHAT_CHARS:,} characters")
    return value


def _ids(value, vocab: int) -> list[int]:
    if not (isinstance(value, list) and len(value) <= MAX_IDS and all(
            isinstance(i, int) and not isinstance(i, bool) and 0 <= i < vocab for i in value)):
        raise BrowserModelError(f"ids must be a list of at most {MAX_IDS} token ids below {vocab}")
    return value


def llm_get(rest: list[str], models: BrowserModels):
    if rest == ["info"]:
        return json_answer(models.info())
    return error_answer(HTTPStatus.NOT_FOUND, "not found")


def llm_post(rest: list[str], query: dict, body: bytes, models: BrowserModels):
    """(status, body, content type) of a POST to /api/llm/<rest>."""
    try:
        if rest == ["load"]:
            return json_answer(models.load(body, query))
        model = models.get(query)
        if rest == ["prompt"]:
            return json_answer(model.prompt_plan(query_integer(query, "tokens", 1, 1 << 20),
                                                 query_integer(query, "position", 0, 1 << 30)))
        if rest == ["encode"]:
            return json_answer({"ids": model.encode_chat(_messages(_body_json(body).get("messages")))})
        if rest == ["decode"]:
            ids = _ids(_body_json(body).get("ids"), model.model.config.vocab_size)
            return json_answer({"text": model.decode_text(ids)})
        return error_answer(HTTPStatus.NOT_FOUND, "not found")
    except KeyError as exc:
        return error_answer(HTTPStatus.NOT_FOUND, str(exc.args[0]) if exc.args else "not found")
    except (PxvmError, ValueError) as exc:  # the file's or the request's problem
        return error_answer(HTTPStatus.BAD_REQUEST, shortened(str(exc), 2000))
