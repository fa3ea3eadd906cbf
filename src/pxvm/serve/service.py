"""The model behind the API: an Engine loaded in a thread of its own (so /health can say
"loading" meanwhile), its tokenizer, and turning checked requests into engine Requests
whose events reach the asyncio loop that serves the client."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time
from dataclasses import dataclass
from typing import AsyncIterator, Callable

from ..core.errors import PxvmError
from ..llm.engine import Engine, Request, TokenEvent
from ..llm.generate import encode_text
from ..llm.sampling import SamplingParams
from ..llm.tokenizer import Tokenizer
from .grammar import JsonGrammars
from .metrics import ServerMetrics
from .sequences import Choice, Piece

log = logging.getLogger("pxvm.serve")


class RequestError(PxvmError):
    """A request the model cannot answer as asked (too long a prompt, say): answered 400
    with the message, which says why and what to change."""

    def __init__(self, message: str, param: str | None = None):
        super().__init__(message)
        self.param = param


@dataclass
class Prompt:
    ids: list[int]
    max_tokens: int


@dataclass
class Job:
    """What a route asks of the engine: prompts, each to be continued `n` times."""

    prompts: list[Prompt]
    n: int
    sampling: SamplingParams
    stops: list[str]
    ignore_eos: bool
    logprobs: int | None
    constraint: Callable[[], Callable] | None   # makes one logits processor per sequence


class Service:
    """Loads the engine (`load`, in a thread) and runs jobs on it."""

    def __init__(self, make_engine: Callable[[], Engine], model_id: str, source: str | None = None):
        self._make_engine = make_engine
        self.model_id = model_id
        self.source = source
        self.engine: Engine | None = None
        self.tokenizer: Tokenizer | None = None
        self.grammars: JsonGrammars | None = None
        self.load_error: str | None = None
        self.created = int(time.time())
        self.loaded = threading.Event()
        self.metrics = ServerMetrics(lambda: self.engine.stats() if self.ready else None)
        self._inboxes: dict[asyncio.AbstractEventLoop, _Inbox] = {}
        self._inboxes_lock = threading.Lock()

    def inbox(self, loop: asyncio.AbstractEventLoop) -> "_Inbox":
        """The engine's events' way into `loop` (one for all its runs)."""
        with self._inboxes_lock:
            for closed in [other for other in self._inboxes if other.is_closed()]:
                del self._inboxes[closed]
            if loop not in self._inboxes:
                self._inboxes[loop] = _Inbox(loop)
            return self._inboxes[loop]

    @property
    def ready(self) -> bool:
        return self.engine is not None and self.tokenizer is not None and self.grammars is not None

    def load(self) -> None:
        """Load the model and start the engine's loop; a failure is kept in load_error."""
        try:
            engine = self._make_engine()
            model = engine.model
            tokenizer = Tokenizer(model.metadata, source=self.source)
            vocab = max(int(getattr(model.config, "vocab_size", 0) or 0), tokenizer.vocab_size)
            grammars = JsonGrammars(tokenizer, vocab)
            engine.start()
            self.engine, self.tokenizer, self.grammars = engine, tokenizer, grammars
        except PxvmError as exc:
            self.load_error = str(exc)
        except Exception as exc:  # a bug: kept for the CLI to report
            log.exception("loading the model failed")
            self.load_error = f"{type(exc).__name__}: {exc}"
        finally:
            self.loaded.set()

    def close(self, timeout: float = 5.0) -> None:
        """Stop the engine: every open request finishes ("cancelled"), so streams end."""
        if self.engine is not None:
            self.engine.shutdown(timeout)

    @property
    def context_length(self) -> int:
        return self.engine.model.context_length

    # ---- prompts -----------------------------------------------------------------------
    def chat_ids(self, messages: list[dict]) -> list[int]:
        return encode_text(self.tokenizer, self.engine.model.metadata, messages=messages)

    def text_ids(self, text: str) -> list[int]:
        return self.tokenizer.encode(text)

    def check_ids(self, ids: list[int]) -> list[int]:
        vocab = self.tokenizer.vocab_size
        bad = next((t for t in ids if not 0 <= t < vocab), None)
        if bad is not None:
            raise RequestError(f"the prompt holds token id {bad}, outside the model's "
                               f"vocabulary of {vocab} tokens (0 to {vocab - 1})", "prompt")
        return ids

    def prompt(self, ids: list[int], max_tokens: int | None, default_max: int | None) -> Prompt:
        """The prompt with its token budget, checked against the context."""
        ctx = self.context_length
        if not ids:
            raise RequestError("the prompt is empty after tokenization; give some text", "prompt")
        room = ctx - len(ids)
        if room < 1:
            raise RequestError(f"the prompt is {len(ids)} tokens but the model's context is "
                               f"{ctx}; shorten the prompt to at most {ctx - 1} tokens",
                               "messages")
        if max_tokens is None:
            return Prompt(ids, room if default_max is None else min(default_max, room))
        if max_tokens > room:
            raise RequestError(f"max_tokens is {max_tokens} but the prompt is {len(ids)} tokens "
                               f"of the model's context of {ctx}: at most {room} can be "
                               "generated; lower max_tokens or shorten the prompt", "max_tokens")
        return Prompt(ids, max_tokens)

    # ---- running -----------------------------------------------------------------------
    def run(self, job: Job) -> "Run":
        return Run(self, job, asyncio.get_running_loop())


class Run:
    """A job's sequences on the engine: submitted at once (all or none), their events
    turned into pieces in the loop's thread; closing it cancels whatever still runs."""

    def __init__(self, service: Service, job: Job, loop: asyncio.AbstractEventLoop):
        self.service = service
        self.engine = service.engine
        self.job = job
        self.loop = loop
        self.queue: asyncio.Queue = asyncio.Queue()
        self.arrival = time.perf_counter()
        self.last_token: dict[int, float] = {}
        tokenizer = service.tokenizer
        self.choices = [Choice(i, tokenizer, job.stops)
                        for i in range(len(job.prompts) * job.n)]
        stop_ids = frozenset() if job.ignore_eos else tokenizer.stop_ids
        try:
            for choice in self.choices:
                prompt = job.prompts[choice.index // job.n]
                sampling = job.sampling
                if sampling.seed is not None:  # each choice its own, reproducible, draws
                    sampling = SamplingParams(**{**vars(sampling),
                                                 "seed": sampling.seed + choice.index % job.n})
                request = Request(prompt_ids=prompt.ids, max_tokens=prompt.max_tokens,
                                  sampling=sampling, stop_token_ids=stop_ids,
                                  logprobs=job.logprobs,
                                  logits_processor=job.constraint() if job.constraint else None)
                choice.request_id = self.engine.submit(request, self._hop(choice.index))
        except BaseException:
            self.cancel()
            raise

    def _hop(self, index: int):
        inbox = self.service.inbox(self.loop)

        def on_event(event):  # in the engine's thread
            inbox.put(self.queue, (index, event))
        return on_event

    def cancel(self) -> None:
        for choice in self.choices:
            if choice.finish is None and choice.request_id >= 0:
                self.engine.cancel(choice.request_id)

    async def pieces(self) -> AsyncIterator[Piece]:
        """Every choice's pieces as they come, until every FinishEvent has arrived; the
        run is cancelled if the consumer stops early (a client gone)."""
        try:
            while any(c.finish is None for c in self.choices):
                index, event = await self.queue.get()
                choice = self.choices[index]
                if isinstance(event, TokenEvent):
                    self._time(index)
                was_done = choice.done
                piece = choice.take(event)
                if choice.done and not was_done and choice.finish is None:
                    self.engine.cancel(choice.request_id)  # a stop string ended it
                if piece is not None:
                    yield piece
        finally:
            self.cancel()

    def _time(self, index: int) -> None:
        now = time.perf_counter()
        before = self.last_token.get(index)
        if before is None:
            self.service.metrics.ttft.observe(now - self.arrival)
        else:
            self.service.metrics.inter_token.observe(now - before)
        self.last_token[index] = now

    def usage(self) -> dict:
        """OpenAI's usage: prompts counted once each (not once a choice), completion
        tokens those the client was given."""
        n = self.job.n
        firsts = [self.choices[i * n].finish for i in range(len(self.job.prompts))]
        prompt_tokens = sum(len(p.ids) for p in self.job.prompts)
        completion = sum(len(c.token_ids) for c in self.choices)
        cached = sum(f.cached_tokens for f in firsts if f is not None)
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion,
                "total_tokens": prompt_tokens + completion,
                "prompt_tokens_details": {"cached_tokens": cached}}


class _Inbox:
    """Events from the engine's thread to one event loop's queues: kept under a lock, and
    the loop woken once for all that arrive before it runs (a wake-up for each token of
    each stream would cost a system call and a pass of the loop each)."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.lock = threading.Lock()
        self.items: list[tuple[asyncio.Queue, object]] = []

    def put(self, queue: asyncio.Queue, item) -> None:
        with self.lock:
            wake = not self.items
            self.items.append((queue, item))
        if wake:
            try:
                self.loop.call_soon_threadsafe(self._deliver)
            except RuntimeError:  # the loop has closed: nobody waits for these
                pass

    def _deliver(self) -> None:  # in the loop's thread
        with self.lock:
            items, self.items = self.items, []
        for queue, item in items:
            queue.put_nowait(item)


def default_model_id(path: str) -> str:
    return os.path.basename(path)
