"""Decoding, one token after another, as fast as the device allows: how the model's
decoding step is recorded, submitted and read back. The math is the model's
(`record_step`); this module only schedules it.

A decoding step is recorded once (a `Graph`) per span of positions: its attention's grid
covers only the keys the span can see (`step_bound`). What changes from token to token
lives in two small tensors on the device: the state [token, position, history...] that
the step reads (the embedding reads the token, attention the position) and rewrites
(the token it draws, the next position, the token also in history[position %
STATE_HISTORY]), and the sampler [temperature, seed, counter]. So steps chain on the
device without the host: `Decoder.run` submits several steps per command buffer and
several submits ahead, encodes the next ones on a worker thread, and reads a submit's
tokens back from the history with one copy. Stopping early wastes at most the steps in
flight.
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator, Protocol

import numpy as np

from ..core import Backend, Tensor
from ..batch import Batch, Graph
from ..core.errors import PxvmError

#: Steps per submit, read back with one copy; submits queued before the host waits for
#: the oldest; submits encoded ahead by the worker thread. Chosen on the H100 with
#: SmolLM2 (docs/benchmarks-log.md).
STEPS_PER_SUBMIT = 2
SUBMITS_IN_FLIGHT = 4
ENCODED_AHEAD = 2
#: Tokens the state keeps (bounds the steps per submit): a submit's steps come back
#: with one copy after the last, since copies between steps split the GPU's pass.
STATE_HISTORY = 16
#: The smallest recorded step's key bound; each next one is STEP_BOUND_GROWTH times
#: larger, the last the whole context. The first span's attention is one key range per
#: head (the WebGPU backend's CACHED_ONE_RANGE_MAX_KEYS); later spans' ranges are merged
#: by the output projection.
FIRST_STEP_BOUND = 64
STEP_BOUND_GROWTH = 4


class ContextOverflowError(PxvmError):
    """The tokens would not fit in the model's context window."""


def step_bound(position: int, context_length: int) -> int:
    """The key bound of the recorded step that decodes the token at `position`: the
    smallest of FIRST_STEP_BOUND, x GROWTH, .. (capped at the context) above it."""
    bound = FIRST_STEP_BOUND
    while bound <= position:
        bound *= STEP_BOUND_GROWTH
    return min(bound, context_length)


class StepModel(Protocol):
    """What a Decoder needs of its model."""

    backend: Backend
    context_length: int
    position: int

    def record_step(self, state: Tensor, sampler: Tensor, max_keys: int) -> dict[str, Tensor]:
        """Record one decoding step driven by `state` (valid at positions below
        `max_keys`); returns at least {"logits": ..., "state": state}."""
        ...


class Decoder:
    """The recorded decoding steps of one model, and the loop that runs them."""

    def __init__(self, model: StepModel):
        self.model = model
        backend = model.backend
        #: [token, position, history...] of the next step
        self.state = backend.from_numpy(np.zeros(2 + STATE_HISTORY, np.int32))
        #: [temperature, seed, counter] of its draw; the counter is the logits' position
        self.sampler = backend.from_numpy(np.zeros(3, np.float32))
        self._steps: dict[int, Graph] = {}  # key bound -> the step recorded for it

    # ---- the recorded steps -------------------------------------------------------------
    def step(self, position: int) -> Graph:
        """The recorded step for a token at `position` (recorded on first use)."""
        bound = step_bound(position, self.model.context_length)
        graph = self._steps.get(bound)
        if graph is None:
            graph = self._steps[bound] = Graph(
                self.model.backend,
                lambda: self.model.record_step(self.state, self.sampler, max_keys=bound))
        return graph

    @property
    def recorded(self) -> dict[int, Graph]:
        """The steps recorded so far, by key bound."""
        return dict(self._steps)

    def forget(self) -> None:
        """Drop the recorded steps: the next use records them again (with the kernels
        that tuning chooses then)."""
        self._steps.clear()

    def set_state(self, token: int, position: int) -> None:
        """Point the steps at `token` at `position`, history cleared."""
        state = np.zeros(2 + STATE_HISTORY, np.int32)
        state[:2] = token, position
        self.state.write(state)

    def logits(self, token: int) -> np.ndarray:
        """Run one step for `token` at the model's position: its logits (vocab,). The
        position does not move (the caller moves it)."""
        position = self.model.position
        self.set_state(token, position)
        return self.step(position).run("logits")["logits"][-1]

    # ---- decoding -----------------------------------------------------------------------
    def run(self, token: int, n: int, temperature: float = 0.0, seed: int = 0) -> Iterator[int]:
        """Feed `token`, then keep feeding the token drawn from each step's logits: the
        argmax (temperature 0) or a draw from softmax(logits / temperature) made where
        the logits are (decoding.sample_step: Gumbel noise from hash(seed, position));
        yields the n tokens chosen and moves the model's position past each. Stopping
        early (closing the generator) leaves the position after the last token the
        caller received. seed: 0 .. 2^24 - 1."""
        if not 0 <= seed < 1 << 24:
            raise ValueError(f"seed must be in 0 .. 2^24 - 1, got {seed}")
        model = self.model
        if n <= 0:
            return
        if model.position + n > model.context_length:
            raise ContextOverflowError(
                f"{model.position + n} tokens do not fit in the context of "
                f"{model.context_length}; lower --max-tokens")
        start = model.position
        self.set_state(int(token), start)
        self.sampler.write(np.array([temperature, seed, start], np.float32))
        plan = deque()  # (first position, steps) of each submit
        at = start
        while at < start + n:
            # the runs of one submit share a recorded step, so they stop at its bound
            runs = min(STEPS_PER_SUBMIT, STATE_HISTORY, start + n - at,
                       step_bound(at, model.context_length) - at)
            plan.append((at, runs))
            at += runs
        yield from self._submit_ahead(plan, start)

    def _submit_ahead(self, plan: deque, start: int) -> Iterator[int]:
        """Run the planned submits, each encoded on a worker thread while this one waits
        for the GPU and hands out tokens (encoding a step costs the host about as much as
        the GPU's step itself on the H100: one thread could not keep the GPU busy)."""
        model = self.model
        received = 0
        encoded: deque = deque()  # (first, runs, future of a PreparedLaunch)
        pending: deque = deque()  # (first, runs, Launch)
        worker = ThreadPoolExecutor(1, thread_name_prefix="pxvm-encode")
        try:
            while plan or encoded:
                while plan and len(encoded) < ENCODED_AHEAD:
                    first, runs = plan.popleft()
                    graph = self.step(first)  # recorded on this thread
                    encoded.append((first, runs, worker.submit(
                        graph.prepare, "state", runs=runs, each_run=False)))
                first, runs, job = encoded.popleft()
                pending.append((first, runs, job.result().submit()))
                while pending and (len(pending) > SUBMITS_IN_FLIGHT or not encoded):
                    first, runs, launch = pending.popleft()
                    history = launch.result()["state"][2:]
                    for p in range(first, first + runs):
                        received += 1
                        model.position = start + received
                        yield int(history[p % STATE_HISTORY])
        finally:
            for _, _, job in encoded:
                job.cancel()
            worker.shutdown(wait=True)
            model.position = start + received

    # ---- where a token's time goes ------------------------------------------------------
    def profile(self, repeats: int = 20) -> dict:
        """Where one decoded token's time goes, at the model's position: host time to
        encode and submit the recorded step, time until its result is back (GPU work
        plus the readback), the whole step's GPU time (timestamps around the pass), and
        the GPU time of every kernel (each dispatch timed alone, which adds a little)."""
        model = self.model
        start = model.position
        step = self.step(start)
        encode, wait = [], []
        for i in range(repeats + 1):
            self.set_state(1, start)
            t0 = time.perf_counter()
            launch = step.launch("state")
            t1 = time.perf_counter()
            launch.result()
            t2 = time.perf_counter()
            if i:
                encode.append(t1 - t0)
                wait.append(t2 - t1)
        self.set_state(1, start)
        timed = step.launch("state", timestamps=True)
        timed.result()
        self.set_state(1, start)
        with Batch(model.backend, profile=True) as batch:
            model.record_step(self.state, self.sampler,
                              max_keys=step_bound(start, model.context_length))
        batch.execute()
        kernels: dict[str, float] = {}
        for label, seconds in batch.profile or []:
            kernels[label] = kernels.get(label, 0.0) + seconds
        model.position = start
        ms = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731
        gpu = timed.device_seconds
        return {
            "dispatches_per_token": step.dispatches,
            "host_encode_submit_ms": ms(encode),
            "gpu_wait_and_readback_ms": ms(wait),
            "gpu_step_ms": None if gpu is None else round(gpu * 1e3, 3),
            "gpu_kernel_ms_total": round(sum(kernels.values()) * 1e3, 3),
            "gpu_kernel_ms_by_kernel": {k: round(v * 1e3, 3) for k, v in
                                        sorted(kernels.items(), key=lambda kv: -kv[1])},
        }
