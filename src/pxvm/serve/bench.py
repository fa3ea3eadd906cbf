"""`pxvm bench serve`: an OpenAI-compatible server measured as vLLM's serving benchmark
measures one. For each concurrency N, clients through the official `openai` client keep N
streaming requests in flight (or start them at a given rate, at most N at once), each a
prompt of random token ids of the given length asking for a given number of tokens
(ignore_eos, so every answer has that length); then aggregate output tokens/s, time to
first token (TTFT), time per output token after the first (TPOT) and the gaps between
tokens (ITL), p50 and p99.

The server is pxvm's own, started in this process on a free loopback port, or any
server at a loopback URL (llama-server, vLLM) given the same model file, whose
tokenizer picks the prompts' tokens. Bounded: N, the requests of a level and its time."""

from __future__ import annotations

import asyncio
import ipaddress
import time
from dataclasses import asdict, dataclass, field
from urllib.parse import urlsplit

import numpy as np

from ..core.errors import PxvmError
from ..llm.tokenizer import Tokenizer

MAX_CONCURRENCY = 1024
MAX_REQUESTS = 100_000


class BenchError(PxvmError):
    """The benchmark cannot run as asked (a URL off this machine, a server that fails)."""


@dataclass
class Settings:
    concurrency: list[int]
    requests: int            # per level
    input_len: int
    output_len: int
    request_rate: float | None = None   # requests/s (Poisson arrivals); None: all at once
    max_seconds: float = 300.0          # per level: no request starts after it
    seed: int = 0


@dataclass
class RequestTiming:
    ttft: float
    latency: float
    itl: list[float]
    output_tokens: int
    error: str | None = None


@dataclass
class Level:
    concurrency: int
    requests: int
    failed: int
    duration_s: float
    output_tokens: int
    output_tokens_per_s: float
    requests_per_s: float
    ttft_ms: dict = field(default_factory=dict)
    tpot_ms: dict = field(default_factory=dict)
    itl_ms: dict = field(default_factory=dict)
    errors: list[str] = field(default_factory=list)


def check_loopback(url: str) -> str:
    """`url` (its /v1 root) when its host is this machine; BenchError otherwise."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    try:
        loopback = host == "localhost" or ipaddress.ip_address(host).is_loopback
    except ValueError:
        loopback = False
    if parts.scheme != "http" or not loopback:
        raise BenchError(f"--url {url!r} is not an http:// address on this machine; the "
                         "benchmark drives only loopback servers")
    return url.rstrip("/") if url.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"


def random_prompts(tokenizer: Tokenizer, count: int, length: int,
                   rng: np.random.Generator) -> list[list[int]]:
    """`count` prompts of `length` token ids drawn from the plain tokens (no control ones)."""
    plain = np.array([i for i in range(tokenizer.vocab_size) if i not in tokenizer.control_ids])
    return [rng.choice(plain, length).tolist() for _ in range(count)]


def _percentiles(values: list[float]) -> dict:
    if not values:
        return {"p50": None, "p99": None, "mean": None}
    a = np.asarray(values) * 1000.0
    return {"p50": float(np.percentile(a, 50)), "p99": float(np.percentile(a, 99)),
            "mean": float(a.mean())}


async def _one(client, model: str, prompt: list[int], output_len: int) -> RequestTiming:
    start = time.perf_counter()
    ttft, last, gaps, tokens = None, None, [], 0
    try:
        stream = await client.completions.create(
            model=model, prompt=prompt, max_tokens=output_len, temperature=0.0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        usage = None
        async for chunk in stream:
            if chunk.usage is not None:
                usage = chunk.usage
            if not chunk.choices or not chunk.choices[0].text:
                continue
            now = time.perf_counter()
            if ttft is None:
                ttft = now - start
            else:
                gaps.append(now - last)
            last = now
            tokens += 1
        if usage is not None:
            tokens = usage.completion_tokens
    except Exception as exc:  # noqa: BLE001 - any failure is counted, the level goes on
        return RequestTiming(0.0, 0.0, [], 0, f"{type(exc).__name__}: {exc}")
    latency = time.perf_counter() - start
    return RequestTiming(ttft if ttft is not None else latency, latency, gaps, tokens)


async def _timings(base_url: str, model: str, prompts: list[list[int]], concurrency: int,
                   settings: Settings, api_key: str) -> list[RequestTiming]:
    """Every prompt's request, at most `concurrency` at once; none starts past max_seconds."""
    from openai import AsyncOpenAI

    import httpx

    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    client = AsyncOpenAI(base_url=base_url, api_key=api_key, max_retries=0, timeout=600,
                         http_client=httpx.AsyncClient(limits=limits, timeout=600))
    rng = np.random.default_rng(settings.seed + concurrency)
    slots = asyncio.Semaphore(concurrency)
    deadline = time.perf_counter() + settings.max_seconds

    async def limited(prompt):
        async with slots:
            if time.perf_counter() > deadline:
                return None
            return await _one(client, model, prompt, settings.output_len)

    tasks = []
    for prompt in prompts:
        if time.perf_counter() > deadline:
            break
        tasks.append(asyncio.create_task(limited(prompt)))
        if settings.request_rate:
            await asyncio.sleep(rng.exponential(1.0 / settings.request_rate))
    timings = [t for t in await asyncio.gather(*tasks) if t is not None]
    await client.close()
    return timings


def summarise(concurrency: int, timings: list[RequestTiming], duration: float) -> Level:
    done = [t for t in timings if t.error is None]
    output = sum(t.output_tokens for t in done)
    tpot = [(t.latency - t.ttft) / (t.output_tokens - 1) for t in done if t.output_tokens > 1]
    return Level(concurrency=concurrency, requests=len(done), failed=len(timings) - len(done),
                 duration_s=duration, output_tokens=output,
                 output_tokens_per_s=output / duration if duration > 0 else 0.0,
                 requests_per_s=len(done) / duration if duration > 0 else 0.0,
                 ttft_ms=_percentiles([t.ttft for t in done]),
                 tpot_ms=_percentiles(tpot),
                 itl_ms=_percentiles([g for t in done for g in t.itl]),
                 errors=sorted({t.error for t in timings if t.error})[:5])


async def run_level(base_url: str, model: str, prompts: list[list[int]], concurrency: int,
                    settings: Settings, api_key: str = "none") -> Level:
    start = time.perf_counter()
    timings = await _timings(base_url, model, prompts, concurrency, settings, api_key)
    return summarise(concurrency, timings, time.perf_counter() - start)


def _client_process(barrier, results, base_url, model, prompts, concurrency, settings,
                    api_key) -> None:
    """One client process of a spread level: its share of the streams, started with the
    others (the barrier), its timings and the monotonic clock's span back to the parent."""
    try:
        barrier.wait(timeout=120)
        start = time.monotonic()
        timings = asyncio.run(_timings(base_url, model, prompts, concurrency, settings,
                                       api_key))
        results.put((start, time.monotonic(), timings))
    except Exception as exc:  # noqa: BLE001 - the parent reports it as the level's error
        results.put(f"a client process failed: {type(exc).__name__}: {exc}")


def run_level_spread(base_url: str, model: str, prompts: list[list[int]], concurrency: int,
                     settings: Settings, api_key: str, processes: int) -> Level:
    """A level whose `concurrency` streams are shared among `processes` client processes
    (one Python process parses a few thousand streamed chunks a second at most): each
    takes every processes-th prompt; the level spans the first start to the last end."""
    import multiprocessing
    import queue

    processes = max(1, min(processes, concurrency, len(prompts)))
    context = multiprocessing.get_context("spawn")  # no forked event loops or threads
    barrier, results = context.Barrier(processes), context.Queue()
    shares = [concurrency // processes + (i < concurrency % processes)
              for i in range(processes)]
    workers = [context.Process(target=_client_process, daemon=True, args=(
        barrier, results, base_url, model, prompts[i::processes], shares[i], settings,
        api_key)) for i in range(processes)]
    for worker in workers:
        worker.start()
    answers = []
    # each process ends by its requests' deadline: it starts none past max_seconds
    wait = 120 + settings.max_seconds + 600
    try:
        for _ in workers:
            answers.append(results.get(timeout=wait))
    except queue.Empty:
        raise BenchError(f"a client process gave no result within {wait:.0f} s") from None
    finally:
        for worker in workers:
            worker.join(5)
            if worker.is_alive():
                worker.kill()
    failures = [a for a in answers if isinstance(a, str)]
    if failures:
        raise BenchError(failures[0])
    timings = [t for _, _, part in answers for t in part]
    span = max(end for _, end, _ in answers) - min(start for start, _, _ in answers)
    return summarise(concurrency, timings, span)


#: Tokens each warm-up request asks for.
WARMUP_TOKENS = 8


def run(settings: Settings, tokenizer: Tokenizer, base_url: str, model: str,
        api_key: str = "none", on_level=None, processes: int = 1) -> list[Level]:
    """Every level in turn against the server at `base_url` (its /v1 root), each level's
    clients in `processes` processes (1: in this one), each level after N unmeasured
    requests of WARMUP_TOKENS tokens at once: a server's first batch of a size may compile
    or record its work (CUDA graphs), as vLLM's benchmark warms up too."""
    rng = np.random.default_rng(settings.seed)
    levels = []
    for n in settings.concurrency:
        warmup = Settings(**{**asdict(settings), "output_len": min(WARMUP_TOKENS,
                                                                   settings.output_len),
                             "request_rate": None})
        asyncio.run(run_level(base_url, model, random_prompts(
            tokenizer, n, settings.input_len, rng), n, warmup, api_key))
        prompts = random_prompts(tokenizer, settings.requests, settings.input_len, rng)
        if processes > 1:
            level = run_level_spread(base_url, model, prompts, n, settings, api_key,
                                     processes)
        else:
            level = asyncio.run(run_level(base_url, model, prompts, n, settings, api_key))
        levels.append(level)
        if on_level is not None:
            on_level(level)
    return levels


def as_json(settings: Settings, levels: list[Level], server: dict) -> dict:
    return {"settings": asdict(settings), "server": server,
            "levels": [asdict(level) for level in levels]}


def write_plot(levels: list[Level], path, title: str) -> None:
    """Output tokens/s and TTFT/TPOT p50 and p99 against N, as a PNG (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = [level.concurrency for level in levels]
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.2))
    left.plot(n, [level.output_tokens_per_s for level in levels], "o-")
    left.set_xlabel("concurrent streams N")
    left.set_ylabel("output tokens/s (all streams)")
    left.set_xscale("log", base=2)
    left.grid(alpha=0.3)
    for name, key, marker in (("TTFT", "ttft_ms", "o"), ("TPOT", "tpot_ms", "s")):
        for q, line in (("p50", "-"), ("p99", "--")):
            right.plot(n, [getattr(level, key)[q] for level in levels], marker=marker,
                       linestyle=line, label=f"{name} {q}")
    right.set_xlabel("concurrent streams N")
    right.set_ylabel("ms")
    right.set_xscale("log", base=2)
    right.set_yscale("log")
    right.legend()
    right.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
