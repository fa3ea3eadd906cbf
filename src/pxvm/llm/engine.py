"""Continuous batching: many requests generated together on one model, for a server.

The engine's thread runs steps. Each step is one forward (Model.forward_paged) over
every running sequence's next tokens, through a paged KV cache whose blocks kv_blocks.py
hands out: a decoding sequence's one token, and chunks of prompts within a budget of
STEP_TOKENS tokens, so running streams keep flowing while a long prompt is read.
Between steps, requests join (admitted while blocks and max_batch allow; prompt blocks
already in the prefix cache are not computed again) and leave (finished or cancelled,
their blocks freed at once). When a running sequence needs a block and none is left, the
newest running sequence is preempted: its blocks are released and it waits at the head
of the queue, to be computed again from its prompt and the tokens it generated.

Each sequence samples on the host with its own pxvm.llm.sampling.Sampler (a numpy
Generator from its seed), so a seeded request draws the same tokens whatever else runs.
A step whose sequences all decode greedily with nothing else asked of their logits
(`_plain_greedy`) takes its tokens' argmax on the device instead, and reads back only
those integers.
The server (pxvm.serve) speaks HTTP; this module knows nothing of it.
"""

from __future__ import annotations

import itertools
import logging
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..core.errors import PxvmError
from .kv_blocks import BlockManager, block_hash, prefix_hashes, ROOT_HASH
from .model import Model, PagedCache, load_model
from .paged_steps import PagedSteps
from .sampling import Sampler, SamplingParams

log = logging.getLogger("pxvm.llm.engine")

#: Tokens a step computes beyond the decoding sequences' one each: prompts are read in
#: chunks of what is left, so one long prompt delays the running streams by one step of
#: this many tokens, not by the whole prompt. vLLM's default budget is 512 to 8192; the
#: smaller keeps the inter-token gap short.
STEP_TOKENS = 512


@dataclass
class Request:
    """One generation: the prompt's token ids (chat template already applied), at most
    `max_tokens` new tokens, drawn with `sampling`; a token of `stop_token_ids` ends it
    (and is not sent). `logprobs` k: each token's logprob and the top k; the
    logits_processor(tokens generated so far, float32 logits (vocab,)) returns the logits
    to sample from (-inf where a grammar forbids)."""

    prompt_ids: list[int]
    max_tokens: int
    sampling: SamplingParams = field(default_factory=SamplingParams)
    stop_token_ids: frozenset[int] = frozenset()
    logprobs: int | None = None
    logits_processor: Callable[[list[int], np.ndarray], np.ndarray] | None = None


@dataclass
class TokenEvent:
    """One generated token; its log-softmax of the model's logits and the top ones (best
    first) where the request asked for logprobs."""

    token_id: int
    logprob: float | None = None
    top_logprobs: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class FinishEvent:
    """A request's last event, sent exactly once. reason: "stop" (a stop token), "length"
    (max_tokens), "cancelled" or "error" (`error` says what)."""

    reason: str
    prompt_tokens: int
    cached_tokens: int       # prompt tokens whose keys came from the prefix cache
    completion_tokens: int   # tokens sent (a stop token is not)
    error: str | None = None


@dataclass
class EngineStats:
    running: int
    waiting: int
    kv_blocks_used: int      # blocks held by running sequences
    kv_blocks_total: int
    prompt_tokens_total: int
    generated_tokens_total: int


class QueueFullError(PxvmError):
    """submit() while `max_waiting` requests already wait, or after shutdown: retry later."""


class RequestError(PxvmError, ValueError):
    """A request the engine cannot run as given (empty prompt, token ids outside the
    vocabulary, prompt and max_tokens beyond the context); the message says which."""


@dataclass(eq=False)
class _Sequence:
    """A request as the engine runs it: its tokens (prompt, then generated) and which of
    them have their keys and values in its blocks."""

    id: int
    request: Request
    on_event: Callable
    sampler: Sampler
    tokens: list[int]
    blocks: list[int] = field(default_factory=list)
    computed: int = 0        # tokens whose keys and values are in the blocks
    hashes: list[bytes] = field(default_factory=list)  # of its full computed blocks
    cached_tokens: int | None = None  # set when first admitted
    finished: bool = False

    @property
    def prompt_tokens(self) -> int:
        return len(self.request.prompt_ids)

    @property
    def generated(self) -> list[int]:
        return self.tokens[self.prompt_tokens:]

    @property
    def generated_count(self) -> int:
        """len(generated), without copying them (asked every token)."""
        return len(self.tokens) - self.prompt_tokens


@dataclass
class _Chunk:
    """A step's tokens of one sequence: tokens[start:start + n]; `samples` where they
    reach its last token, whose logits then choose the next."""

    seq: _Sequence
    start: int
    n: int

    @property
    def samples(self) -> bool:
        return self.start + self.n == len(self.seq.tokens)


class Engine:
    """Runs requests (submit) with continuous batching on `model` (a loaded Model, or a
    GGUF path loaded on `backend`): at most `max_batch` sequences a step, a paged KV cache
    of `kv_blocks` blocks of `block_size` positions (None: as many as max_batch sequences
    of the whole context take, at most what fits in memory), at most `max_waiting`
    requests waiting. Events go to each request's on_event from the engine's thread."""

    def __init__(self, model: Model | str, *, backend="auto", max_batch: int = 64,
                 block_size: int = 16, kv_blocks: int | None = None, max_waiting: int = 256,
                 progress: bool = False):
        for name, value in (("max_batch", max_batch), ("block_size", block_size),
                            ("max_waiting", max_waiting), ("kv_blocks", kv_blocks)):
            if value is None and name == "kv_blocks":
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be a positive integer, not {value!r}")
        self.model = model if isinstance(model, Model) else load_model(
            model, backend=backend, progress=progress)
        self.context_length = self.model.context_length
        self.max_batch, self.max_waiting = max_batch, max_waiting
        # and one more block, the decoding graphs' scratch (paged_steps.py)
        self.cache: PagedCache = self.model.paged_cache(
            block_size, None if kv_blocks is None else kv_blocks + 1, max_batch)
        self.block_size = block_size
        self.blocks = BlockManager(self.cache.blocks - 1)
        self.steps = PagedSteps(self.model, self.cache, scratch=self.cache.blocks - 1,
                                width=self._blocks_for(self.context_length),
                                max_batch=max_batch)
        self.running: list[_Sequence] = []   # in order of admission
        self.waiting: deque[_Sequence] = deque()
        self._events: list[tuple[_Sequence, object]] = []  # to send from the engine thread
        self._ids = itertools.count(1)
        self._by_id: dict[int, _Sequence] = {}
        self._wake = threading.Condition()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._prompt_total = self._generated_total = 0

    # ---- the API (any thread) -----------------------------------------------------------
    def start(self) -> None:
        """Start the engine's thread (a daemon), which idles when there is no work."""
        with self._wake:
            if self._thread is None and not self._stopping:
                self._thread = threading.Thread(target=self._loop, name="pxvm-engine",
                                                daemon=True)
                self._thread.start()

    def submit(self, request: Request, on_event: Callable[[TokenEvent | FinishEvent], None]
               ) -> int:
        """Queue `request`; returns its id. RequestError when it cannot run,
        QueueFullError when max_waiting requests wait or the engine is shut down."""
        self._check(request)
        with self._wake:
            if self._stopping:
                raise QueueFullError("the engine is shutting down; retry on another server")
            if len(self.waiting) >= self.max_waiting:
                raise QueueFullError(f"{len(self.waiting)} requests are already waiting "
                                     f"(max_waiting={self.max_waiting}); retry later")
            seq = _Sequence(next(self._ids), request, on_event, Sampler(request.sampling),
                            list(map(int, request.prompt_ids)))
            self._by_id[seq.id] = seq
            self.waiting.append(seq)
            self._wake.notify()
        return seq.id

    def cancel(self, request_id: int) -> None:
        """End a request now (its blocks freed at once); FinishEvent("cancelled") follows
        from the engine thread. Nothing for an unknown or finished request."""
        with self._wake:
            seq = self._by_id.get(request_id)
            if seq is not None:
                self._finish(seq, "cancelled")
                self._wake.notify()

    @property
    def alive(self) -> bool:
        """Whether the engine's thread runs (started, not shut down, not died)."""
        return self._thread is not None and self._thread.is_alive()

    def stats(self) -> EngineStats:
        with self._wake:
            return EngineStats(len(self.running), len(self.waiting), self.blocks.used(),
                               self.blocks.total, self._prompt_total, self._generated_total)

    def shutdown(self, timeout: float = 5.0) -> None:
        """Take no more requests and end every open one with FinishEvent("cancelled"),
        waiting up to `timeout` seconds for the engine's thread to send them."""
        with self._wake:
            self._stopping = True
            self._wake.notify()
            thread = self._thread
        if thread is None:  # never started: the events go from here
            with self._wake:
                self._cancel_all()
                events = self._take_events()
            _deliver(events)
        elif thread is not threading.current_thread():  # (shut down from a callback)
            thread.join(timeout)

    # ---- checks -------------------------------------------------------------------------
    def _check(self, request: Request) -> None:
        ids, vocab = request.prompt_ids, self.model.config.vocab_size
        if len(ids) == 0:
            raise RequestError("the prompt has no tokens")
        if any(isinstance(t, bool) or not isinstance(t, (int, np.integer)) or not 0 <= t < vocab
               for t in ids):
            raise RequestError(f"prompt token ids must be integers in 0..{vocab - 1}")
        if isinstance(request.max_tokens, bool) or not isinstance(request.max_tokens, int) \
                or request.max_tokens < 1:
            raise RequestError(f"max_tokens must be a positive integer, not "
                               f"{request.max_tokens!r}")
        if len(ids) + request.max_tokens > self.context_length:
            raise RequestError(f"{len(ids)} prompt tokens and max_tokens={request.max_tokens} "
                               f"do not fit in the context of {self.context_length}")
        if request.logprobs is not None and not 0 <= request.logprobs <= vocab:
            raise RequestError(f"logprobs must be in 0..{vocab}, not {request.logprobs}")

    # ---- the engine's thread ------------------------------------------------------------
    def _loop(self) -> None:
        self.model.backend.bind_thread()
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._stopping or self._events or self.running
                                    or self.waiting)
                stopping = self._stopping
                chunks, step = [], None
                try:
                    if stopping:
                        self._cancel_all()
                    else:
                        chunks = self._schedule()
                        # the step's tables now: a callback below may cancel one of them
                        step = self._tables(chunks) if chunks else None
                except Exception as exc:  # noqa: BLE001 - a bug here must not hang clients
                    log.exception("pxvm engine: scheduling failed")
                    for seq in [*self.running, *self.waiting]:
                        self._finish(seq, "error", f"{type(exc).__name__}: {exc}")
                    chunks, step = [], None
                events = self._take_events()
            _deliver(events)
            if stopping:
                return
            if step is not None:
                self._step(chunks, step)
            else:  # work that cannot be scheduled yet: not expected, but never spin
                with self._wake:
                    self._wake.wait(0.01)

    def _step(self, chunks: list[_Chunk], tables: tuple) -> None:
        """One forward over the chunks, then their new tokens; an error ends the
        chunks' requests with FinishEvent("error"), never the engine."""
        if self._chains(chunks):
            self._chained_steps(chunks, tables)
            return
        sampling = [c for c in chunks if c.samples]
        greedy = all(_plain_greedy(c.seq.request) for c in sampling)
        try:
            rows = self.steps.run(*tables, greedy=greedy)
        except Exception as exc:  # noqa: BLE001 - the requests get the error, not the thread
            log.exception("pxvm engine: a step failed")
            with self._wake:
                for chunk in chunks:
                    self._finish(chunk.seq, "error", f"{type(exc).__name__}: {exc}")
            return
        with self._wake:
            for chunk in chunks:
                self._computed(chunk)
            for chunk, row in zip(sampling, rows[len(rows) - len(sampling):]):
                if not chunk.seq.finished:
                    try:
                        if greedy:
                            self._take_token(chunk.seq, int(row))
                        else:
                            self._next_token(chunk.seq, row)
                    except Exception as exc:  # noqa: BLE001 - a bad logits_processor
                        log.exception("pxvm engine: sampling failed")
                        self._finish(chunk.seq, "error", f"{type(exc).__name__}: {exc}")

    def _chains(self, chunks: list[_Chunk]) -> bool:
        """Whether the step is greedy decoding the graphs can chain (PagedSteps.chain):
        each chunk its sequence's last token, plain greedy, within the largest graph."""
        return (self.steps.chains and len(chunks) <= self.steps.sizes[-1]
                and all(c.n == 1 and c.samples and _plain_greedy(c.seq.request)
                        for c in chunks))

    def _chained_steps(self, chunks: list[_Chunk], tables: tuple) -> None:
        """The step, then the steps after it while the batch stays the same, each launched
        from the tokens its predecessor left on the device before the host reads those:
        the GPU runs step i + 1 while the host sends step i's tokens."""
        ids, token_table, block_table, _ = tables
        written = [len(c.seq.blocks) for c in chunks]  # each sequence's blocks in the table
        following = None
        try:
            launch = self.steps.launch(ids, token_table, block_table)
            while True:
                with self._wake:
                    ahead = self._ahead(chunks, written)
                following = self.steps.chain() if ahead is not None else None
                tokens = launch.result()["greedy"][:len(chunks)]
                with self._wake:
                    for chunk in chunks:
                        self._computed(chunk)
                    for chunk, token in zip(chunks, tokens):
                        if not chunk.seq.finished:
                            self._take_token(chunk.seq, int(token))
                    events = self._take_events()
                _deliver(events)
                if following is None:
                    return
                chunks, launch, following = ahead, following, None
        except Exception as exc:  # noqa: BLE001 - the requests get the error, not the thread
            log.exception("pxvm engine: a step failed")
            with self._wake:
                for chunk in chunks:
                    self._finish(chunk.seq, "error", f"{type(exc).__name__}: {exc}")
            if following is not None:  # its results are nobody's now; let it end
                try:
                    following.result()
                except Exception:  # noqa: BLE001 - already reported above
                    pass

    def _ahead(self, chunks: list[_Chunk], written: list[int]) -> list[_Chunk] | None:
        """The chunks of the step after `chunks` (their sequences' next tokens, whose ids
        the device holds), where nothing else should happen first: no sequence of the
        step ends with it or is gone, no request waits for room, none stops the engine,
        each next position is in a block the step's table holds (the engine's thread
        alone preempts, between such runs). Else None."""
        if self._stopping or (self.waiting and len(self.running) < self.max_batch):
            return None
        for chunk, blocks in zip(chunks, written):
            seq = chunk.seq
            if (seq.finished or seq.generated_count + 1 >= seq.request.max_tokens
                    or (chunk.start + 1) // self.block_size >= blocks):
                return None
        return [_Chunk(c.seq, c.start + 1, 1) for c in chunks]

    def _tables(self, chunks: list[_Chunk]) -> tuple:
        """forward_paged's arguments for the chunks. Tokens go in any order
        (attention_paged's table says where each is): every other token first, then the
        sampling chunks' last ones, so that the LM head runs on those rows only."""
        body, tail = [], []
        for row, c in enumerate(chunks):
            entries = [(c.seq.tokens[p], row, p) for p in range(c.start, c.start + c.n)]
            if c.samples:
                tail.append(entries.pop())
            body += entries
        ids, table_seq, table_pos = map(list, zip(*(body + tail)))
        width = max(len(c.seq.blocks) for c in chunks)
        block_table = np.zeros((len(chunks), width), np.int32)
        for row, c in enumerate(chunks):
            block_table[row, :len(c.seq.blocks)] = c.seq.blocks
        token_table = np.stack([table_seq, table_pos], axis=1).astype(np.int32)
        return np.array(ids, np.int32), token_table, block_table, max(len(tail), 1)

    # ---- scheduling (under the lock) ----------------------------------------------------
    def _schedule(self) -> list[_Chunk]:
        """This step's chunks: each running sequence's next token or prompt chunk (oldest
        first, preempting the newest where blocks run out), then new sequences admitted
        while the token budget, max_batch and the blocks allow."""
        budget, chunks = STEP_TOKENS, []
        for seq in list(self.running):
            if seq not in self.running:  # preempted for an older one this step
                continue
            pending = len(seq.tokens) - seq.computed
            n = 1 if pending == 1 else min(pending, budget)  # decoding never waits
            if n and self._grow(seq, seq.computed + n):
                chunks.append(_Chunk(seq, seq.computed, n))
                budget -= n
        while self.waiting and len(self.running) < self.max_batch and budget > 0:
            seq = self.waiting[0]
            most = self._blocks_for(seq.prompt_tokens + seq.request.max_tokens)
            if most > self.blocks.total:  # it could never finish, however long it waited
                self._finish(seq, "error", f"the request may need {most} KV blocks of "
                             f"{self.block_size} positions, more than the engine's "
                             f"{self.blocks.total}; lower max_tokens or start the engine "
                             f"with more kv_blocks")
                continue
            chunk = self._admit(seq, budget)
            if chunk is None:
                break
            chunks.append(chunk)
            budget -= chunk.n
        return chunks

    def _blocks_for(self, tokens: int) -> int:
        return -(-tokens // self.block_size)

    def _grow(self, seq: _Sequence, tokens: int) -> bool:
        """Blocks for seq's first `tokens` tokens, preempting the newest running sequences
        while too few are left; False where seq itself was the newest (preempted)."""
        needed = self._blocks_for(tokens) - len(seq.blocks)
        while needed > self.blocks.available():
            victim = self.running[-1]
            self._preempt(victim)
            if victim is seq:
                return False
        seq.blocks += self.blocks.allocate(max(needed, 0))
        return True

    def _preempt(self, seq: _Sequence) -> None:
        """Free seq's blocks; it waits first in line, to be computed again (much of it
        from the prefix cache where its blocks are not evicted meanwhile)."""
        log.debug("pxvm engine: preempting request %d at %d tokens", seq.id, len(seq.tokens))
        self.running.remove(seq)
        self.blocks.release(seq.blocks)
        seq.blocks, seq.hashes, seq.computed = [], [], 0
        self.waiting.appendleft(seq)

    def _admit(self, seq: _Sequence, budget: int) -> _Chunk | None:
        """Start (or resume) seq with its first chunk: the cached blocks of its prefix
        taken, blocks for the rest of the chunk allocated, leaving one block for each
        running sequence to grow by; None where they are not there."""
        # blocks wholly before the last token: that one is always computed (its logits
        # choose the next token) and so never written into a shared block
        hashes = prefix_hashes(seq.tokens, self.block_size,
                               (len(seq.tokens) - 1) // self.block_size)
        cached = self.blocks.cached_prefix(hashes)
        computed = len(cached) * self.block_size
        n = min(len(seq.tokens) - computed, budget)
        needed = self._blocks_for(computed + n) - len(cached)
        idle_cached = sum(1 for b in cached if self.blocks.refs[b] == 0)
        if needed + len(self.running) > self.blocks.available() - idle_cached:
            return None
        self.waiting.popleft()
        self.blocks.take(cached)
        seq.blocks = cached + self.blocks.allocate(needed)
        seq.hashes, seq.computed = hashes[:len(cached)], computed
        if seq.cached_tokens is None:
            seq.cached_tokens = computed
            self._prompt_total += len(seq.tokens)
        self.running.append(seq)
        return _Chunk(seq, computed, n)

    # ---- a step's results (under the lock) ----------------------------------------------
    def _computed(self, chunk: _Chunk) -> None:
        """The chunk's keys and values are in its blocks: full blocks join the prefix cache."""
        seq = chunk.seq
        if seq.finished or seq.computed != chunk.start:  # cancelled or preempted meanwhile
            return
        seq.computed += chunk.n
        for j in range(len(seq.hashes), seq.computed // self.block_size):
            previous = seq.hashes[-1] if seq.hashes else ROOT_HASH
            seq.hashes.append(block_hash(previous, seq.tokens[j * self.block_size:
                                                              (j + 1) * self.block_size]))
            self.blocks.register(seq.blocks[j], seq.hashes[-1])

    def _next_token(self, seq: _Sequence, logits: np.ndarray) -> None:
        """Sample seq's next token from its logits; send it or finish."""
        request = seq.request
        logits = np.asarray(logits, np.float32)
        chosen = logits
        if request.logits_processor is not None:
            chosen = np.asarray(request.logits_processor(list(seq.generated), logits.copy()),
                                np.float32)
        self._take_token(seq, seq.sampler(chosen, _penalty_window(seq.tokens,
                                                                   request.sampling)), logits)

    def _take_token(self, seq: _Sequence, token: int, logits: np.ndarray | None = None) -> None:
        """Send seq's next token (its logprobs from `logits`, where asked) or finish."""
        request = seq.request
        if token in request.stop_token_ids:
            self._finish(seq, "stop")
            return
        event = TokenEvent(token)
        if request.logprobs is not None:
            event.logprob, event.top_logprobs = _logprobs(logits, token, request.logprobs)
        seq.tokens.append(token)
        self._generated_total += 1
        self._events.append((seq, event))
        if seq.generated_count >= request.max_tokens:
            self._finish(seq, "length")

    def _finish(self, seq: _Sequence, reason: str, error: str | None = None) -> None:
        """End seq: its blocks freed, its FinishEvent queued."""
        if seq.finished:
            return
        seq.finished = True
        if seq in self.running:
            self.running.remove(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
        self.blocks.release(seq.blocks)
        seq.blocks = []
        del self._by_id[seq.id]
        self._events.append((seq, FinishEvent(reason, seq.prompt_tokens, seq.cached_tokens or 0,
                                              seq.generated_count, error)))

    def _cancel_all(self) -> None:
        for seq in [*self.running, *self.waiting]:
            self._finish(seq, "cancelled")

    def _take_events(self) -> list[tuple[_Sequence, object]]:
        events, self._events = self._events, []
        return events


def _plain_greedy(request: Request) -> bool:
    """Whether the request's next token is the logits' argmax and nothing else of them is
    needed (no penalty, processor or logprobs): it can be taken on the device."""
    params = request.sampling
    return (params.temperature == 0.0 and params.repeat_penalty == 1.0
            and request.logits_processor is None and request.logprobs is None)


def _penalty_window(tokens: list[int], params: SamplingParams) -> list[int]:
    """The tokens the repetition penalty looks at (the Sampler's `previous`), cut here:
    copying a whole long context for every token of every sequence would cost the step."""
    if params.repeat_penalty == 1.0 or params.repeat_last_n <= 0:
        return []
    return tokens[-params.repeat_last_n:]


def _logprobs(logits: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """The chosen token's log-softmax of the model's logits, and the k best (id, logprob)."""
    z = np.asarray(logits, np.float64)
    z = z - z.max()
    logp = z - np.log(np.exp(z).sum())
    top = np.argpartition(-logp, k - 1)[:k] if 0 < k < logp.size else np.arange(logp.size)[:k]
    top = top[np.argsort(-logp[top], kind="stable")]
    return float(logp[token]), [(int(i), float(logp[i])) for i in top]


def _deliver(events: list[tuple[_Sequence, object]]) -> None:
    """Send events outside the lock (a callback may cancel or submit); a callback's error
    is logged, not the engine's end."""
    for seq, event in events:
        try:
            seq.on_event(event)
        except Exception:  # noqa: BLE001 - the server's bug must not stop other streams
            log.exception("pxvm engine: on_event of request %d failed", seq.id)


def benchmark_batched(model: Model, batch: int, prompt_tokens: int, gen_tokens: int,
                      repeats: int = 3, warmup: int = 1) -> dict:
    """The engine's throughput as llama-batched-bench measures it (-npp, -ntg, -npl):
    `batch` requests of `prompt_tokens` seeded random ids, submitted together, each
    generating `gen_tokens` greedy tokens (no stop token), on an engine of max_batch
    `batch` with blocks for all of them. Prompt tokens/s: the batch's prompt tokens over
    the time until every request has its first token (the engine decodes the first
    requests meanwhile: prompts are chunked); generation tokens/s: the tokens generated
    after that over the time they took (every prompt read: decoding only); total: all
    tokens over the whole run. Medians of `repeats` runs after `warmup` unmeasured ones,
    each with new prompts (the prefix cache would otherwise serve them)."""
    if min(batch, prompt_tokens, gen_tokens, repeats) < 1 or warmup < 0:
        raise ValueError("batch, prompt_tokens, gen_tokens and repeats must be >= 1, "
                         "warmup >= 0")
    if prompt_tokens + gen_tokens > model.context_length:
        raise RequestError(f"{prompt_tokens} + {gen_tokens} tokens exceed the model's context "
                           f"of {model.context_length}; lower --prompt-tokens or --gen-tokens "
                           f"or raise --context")
    block_size = 16
    engine = Engine(model, max_batch=batch, block_size=block_size, max_waiting=batch,
                    kv_blocks=batch * -(-(prompt_tokens + gen_tokens) // block_size))
    engine.start()
    rng = np.random.default_rng(0)
    runs = []
    try:
        for run in range(warmup + repeats):
            prompts = rng.integers(0, model.config.vocab_size, (batch, prompt_tokens))
            timing = _timed_run(engine, prompts.tolist(), gen_tokens)
            if run >= warmup:
                runs.append(timing)
    finally:
        engine.shutdown()
    median = lambda key: float(np.median([r[key] for r in runs]))  # noqa: E731
    return {"backend": model.backend_name, "device": model.device_name,
            "kv_cache": model.kv_cache, "batch": batch, "prompt_tokens": prompt_tokens,
            "gen_tokens": gen_tokens, "repeats": repeats, "runs": runs,
            "prompt_tokens_per_s": median("prompt_tokens_per_s"),
            "generation_tokens_per_s": median("generation_tokens_per_s"),
            "total_tokens_per_s": median("total_tokens_per_s")}


def _timed_run(engine: Engine, prompts: list[list[int]], gen_tokens: int) -> dict:
    """One benchmark_batched run: its seconds and speeds."""
    token_times: list[float] = []
    first_times: dict[int, float] = {}
    finished: list[FinishEvent] = []
    done = threading.Event()

    def on_event(key):
        def record(event):  # from the engine thread only: no lock needed
            now = time.perf_counter()
            if isinstance(event, TokenEvent):
                token_times.append(now)
                first_times.setdefault(key, now)
            else:
                finished.append(event)
                if len(finished) == len(prompts):
                    done.set()
        return record

    start = time.perf_counter()
    for key, prompt in enumerate(prompts):
        engine.submit(Request(prompt, gen_tokens), on_event(key))
    done.wait()
    end = time.perf_counter()
    if failed := [f for f in finished if f.reason != "length"]:
        raise PxvmError(f"a benchmark request ended with {failed[0].reason}: "
                        f"{failed[0].error}")
    prompts_read = max(first_times.values())
    after = sum(t > prompts_read for t in token_times)
    decoding_s = end - prompts_read
    total = sum(map(len, prompts)) + len(token_times)
    return {"prompt_s": prompts_read - start, "generation_s": decoding_s,
            "prompt_tokens_per_s": sum(map(len, prompts)) / (prompts_read - start),
            "generation_tokens_per_s": after / decoding_s if after else 0.0,
            "total_tokens_per_s": total / (end - start)}
