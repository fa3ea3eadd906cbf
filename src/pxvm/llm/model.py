"""The llama-family transformer, written once over pxvm ops so that the same code runs on
the WebGPU backend (weights resident and still quantized) and on the numpy backend.

A prompt runs as one batch of matrix products. A single token runs a decoding step
recorded once as a `Graph`: the token and its position live in a small state tensor on
the device, so each step only re-submits the same dispatches; greedy decoding chains
steps on the GPU (the argmax becomes the next step's token) without waiting for the host,
several steps per submit.
A step is recorded per span of positions (`step_bound`): attention's grid covers only the
keys the span can see.
"""

from __future__ import annotations

from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np

from ..backends import get_backend
from ..batch import Batch, Graph
from ..runtime.errors import PxvmError
from .gguf_model import Config, GGUFModelFile, Weight, default_model_path

#: Greedy decoding submits this many steps in one command buffer and reads their tokens
#: back with one map, with SUBMITS_IN_FLIGHT submits queued before the host waits for
#: the oldest, so that the GPU does not wait for the host's encoding. On the H100
#: (benchmarks/h100/decode_overlap.py, SmolLM2, 128 tokens from an empty context, the
#: encoding on a worker thread): 2 steps x 4 in flight 974.5 tokens/s, 4 x 2 996.0,
#: 1 x 8 919.9; the GPU alone, every submit encoded before the first runs, 1,011-1,025.
#: (4 x 2 and 2 x 4 measured the same in tree_ab.sh's benchmark.) Stopping early wastes
#: at most the steps in flight.
STEPS_PER_SUBMIT = 2
SUBMITS_IN_FLIGHT = 4
#: The state tensor [token, position, history...] keeps each step's token in
#: history[position % STATE_HISTORY] (greedy_step), so a submit's steps come back with one
#: copy after the last: copies between steps split the GPU's pass (on the H100 they cost
#: ~39 us a step, benchmarks/h100/decode_overlap.py). Bounds the steps per submit.
STATE_HISTORY = 16
#: Submits encoded ahead by decode_greedy's worker thread.
ENCODED_AHEAD = 2

#: Prompts of at least this many tokens are submitted layer by layer (Batch.flush), so
#: the GPU runs each layer while the host records the next: recording a prompt's 183
#: dispatches took the H100's host 40 ms, as long as their GPU time for 512 tokens
#: (benchmarks/h100/prefill_profile.py). The bound is a judgement, not a measurement:
#: a short prompt's GPU time is small, so there is little to overlap (flushing from 16
#: tokens measured the same as from 64 at 512 tokens).
FLUSH_MIN_TOKENS = 64

#: The smallest recorded step's key bound; each next one is STEP_BOUND_GROWTH times larger,
#: the last the whole context. The first span's attention is one key range per head
#: (pxvm.ops.attention.CACHED_ONE_RANGE_MAX_KEYS), the others' ranges are merged by the
#: output projection.
FIRST_STEP_BOUND = 64
STEP_BOUND_GROWTH = 4


def step_bound(position: int, context_length: int) -> int:
    """The key bound of the recorded step that decodes the token at `position`: the
    smallest of FIRST_STEP_BOUND, x GROWTH, .. (capped at the context) above it."""
    bound = FIRST_STEP_BOUND
    while bound <= position:
        bound *= STEP_BOUND_GROWTH
    return min(bound, context_length)


class ContextOverflowError(PxvmError):
    """The tokens would not fit in the model's context window."""


@dataclass
class Matrix:
    """A weight matrix on the backend, as raw GGUF rows: (N, row_bytes) uint8."""

    tensor: object
    qtype: int
    k: int


@dataclass
class Layer:
    attn_norm: object
    qkv: list[Matrix]      # [Wq; Wk; Wv] rows, joined per run of one tensor type
    wo: Matrix
    ffn_norm: object
    gate_up: list[Matrix]  # [Wgate; Wup] joined when of one type, else the two
    w_down: Matrix


class Model:
    """A loaded model with its KV cache. `forward(tokens)` runs them at the current
    position and returns the last position's logits; `decode_greedy` chains steps."""

    def __init__(self, file: GGUFModelFile, backend="auto", progress: bool = True,
                 max_context: int | None = None):
        self.file = file
        self.config: Config = file.config
        self.metadata = file.metadata
        self.backend = get_backend(backend)
        self.backend_name = self.backend.name
        self.device_name = self.backend.describe()
        cfg = self.config
        self.context_length = min(cfg.context_length, max_context or cfg.context_length)
        names = ["token_embd.weight", "output_norm.weight"]
        if not cfg.tied_output:
            names.append("output.weight")
        for i in range(cfg.n_layers):
            names += [f"blk.{i}.{n}.weight" for n in ("attn_norm", "attn_q", "attn_k", "attn_v",
                      "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
        w = {name: file.weight(name) for name in names}
        self.layers = []
        steps = _progress(range(cfg.n_layers), progress,
                          f"loading {cfg.n_layers} layers to {self.backend.name}")
        for i in steps:
            blk = lambda n: w[f"blk.{i}.{n}.weight"]  # noqa: E731
            self.layers.append(Layer(
                self._vector(blk("attn_norm")),
                self._joined([blk("attn_q"), blk("attn_k"), blk("attn_v")]),
                self._matrix([blk("attn_output")]),
                self._vector(blk("ffn_norm")),
                self._joined([blk("ffn_gate"), blk("ffn_up")]),
                self._matrix([blk("ffn_down")])))
        self.embedding = self._matrix([w["token_embd.weight"]])
        self.output_norm = self._vector(w["output_norm.weight"])
        self.output = self.embedding if cfg.tied_output else self._matrix([w["output.weight"]])
        kv_shape = (self.context_length, cfg.n_kv_heads, cfg.head_dim)
        zeros = np.zeros(kv_shape, np.float32)
        self.k_cache = [self.backend.from_numpy(zeros) for _ in range(cfg.n_layers)]
        self.v_cache = [self.backend.from_numpy(zeros) for _ in range(cfg.n_layers)]
        # [token, position, history...] of the next decoding step, read by the
        # recorded step (the history: its tokens, STATE_HISTORY)
        self.state = self.backend.from_numpy(np.zeros(2 + STATE_HISTORY, np.int32))
        # [temperature, seed, counter] of the recorded step's draw (sample_step): the
        # counter is the position of the logits drawn from
        self.sampler = self.backend.from_numpy(np.zeros(3, np.float32))
        self._steps: dict[int, Graph] = {}  # key bound -> the step recorded for it
        self.position = 0

    def _vector(self, w: Weight):
        return self.backend.from_numpy(np.asarray(w.data, np.float32))

    def _matrix(self, weights: list[Weight]) -> Matrix:
        """The weights' raw rows stacked in one matrix (all of one type and row length)."""
        rows = [np.ascontiguousarray(w.data).view(np.uint8).reshape(w.shape[0], -1)
                for w in weights]
        data = rows[0] if len(rows) == 1 else np.concatenate(rows)
        return Matrix(self.backend.from_numpy(data), weights[0].qtype, weights[0].shape[1])

    def _joined(self, weights: list[Weight]) -> list[Matrix]:
        """Consecutive weights of one tensor type joined into one matrix, so that one
        product computes them all (files that mix types per layer get several)."""
        runs: list[list[Weight]] = []
        for w in weights:
            if runs and runs[-1][0].qtype == w.qtype:
                runs[-1].append(w)
            else:
                runs.append([w])
        return [self._matrix(run) for run in runs]

    def reset(self) -> None:
        """Forget the conversation: the next forward starts at position 0."""
        self.position = 0

    def warm_up(self) -> None:
        """Compile the kernels and record the decoding steps that a generation uses, so
        that its first tokens are not timed with them: `pxvm generate` on the H100
        reported 42 and 68 tokens/s for SmolLM2's prompt and answer, against 814 for
        decoding warm. benchmarks/h100/first_use.py (SmolLM2's shapes, fresh processes,
        two each): warm-up 0.82-0.91 s, then a 37-token prefill at 616-849 tokens/s, 8
        sampled tokens at 293-442, 32 greedy at 715-794; without it 26-42, 19-90 and
        183-345. A prompt of up to 65 tokens (several key ranges, then a merge pass), one
        decoding step run after it (ranges merged by the output projection) and the
        first span's step recorded (one range) reach every kernel variant. Leaves the
        cache empty (position 0)."""
        if not hasattr(self.backend, "context"):
            return  # numpy compiles nothing
        self.reset()
        self.forward([0] * max(1, min(FIRST_STEP_BOUND + 1, self.context_length - 1)))
        self.forward([0])
        self._decode_step(0)
        self.reset()

    # ---- running ----------------------------------------------------------------------
    def forward(self, token_ids) -> np.ndarray:
        """Run `token_ids` at the current position; logits (vocab,) of the last one."""
        ids = self._checked(token_ids)
        if ids.size > 1:
            return self._run(ids, last_only=True)[-1]
        self.set_state(int(ids[0]), self.position)
        logits = self._decode_step(self.position).run("logits")["logits"]
        self.position += 1
        return logits[-1]

    def forward_all(self, token_ids) -> np.ndarray:
        """As forward, but the logits of every position: (len(token_ids), vocab)."""
        return self._run(self._checked(token_ids), last_only=False)

    def decode_greedy(self, token: int, n: int):
        """Feed `token`, then keep feeding the most likely next token: yields the n tokens
        chosen (decode with temperature 0)."""
        return self.decode(token, n)

    def decode(self, token: int, n: int, temperature: float = 0.0, seed: int = 0):
        """Feed `token`, then keep feeding the token drawn from each step's logits: the
        argmax (temperature 0) or a draw from softmax(logits / temperature) made where the
        logits are (sample_step: Gumbel noise from hash(seed, position)); yields the n
        tokens chosen. On the GPU the steps chain on the device and are submitted ahead
        of the host reading them; stopping early (closing the generator) leaves the
        position after the last token the caller received. seed: 0 .. 2^24 - 1."""
        if not 0 <= seed < 1 << 24:
            raise ValueError(f"seed must be in 0 .. 2^24 - 1, got {seed}")
        self._checked([token])
        if n <= 0:
            return
        if self.position + n > self.context_length:
            raise ContextOverflowError(
                f"{self.position + n} tokens do not fit in the context of "
                f"{self.context_length}; lower --max-tokens")
        self.set_state(int(token), self.position)
        self.sampler.write(np.array([temperature, seed, self.position], np.float32))
        start, received = self.position, 0
        plan = deque()  # (first position, steps) of each submit
        at = start
        while at < start + n:
            # the runs of one submit share a recorded step, so they stop at its bound
            runs = min(STEPS_PER_SUBMIT, STATE_HISTORY, start + n - at,
                       step_bound(at, self.context_length) - at)
            plan.append((at, runs))
            at += runs
        encoded: deque = deque()  # (first, runs, future of a PreparedLaunch)
        pending: deque = deque()  # (first, runs, Launch)
        # A worker thread encodes the next submits while this one waits for the GPU and
        # hands out tokens: encoding a step costs the host about as much as the GPU's
        # step itself (H100, BENCHMARKS.md), so one thread could not keep the GPU busy.
        worker = ThreadPoolExecutor(1, thread_name_prefix="pxvm-encode")
        try:
            while plan or encoded:
                while plan and len(encoded) < ENCODED_AHEAD:
                    first, runs = plan.popleft()
                    graph = self._decode_step(first)  # recorded on this thread
                    encoded.append((first, runs, worker.submit(
                        graph.prepare, "state", runs=runs, each_run=False)))
                first, runs, job = encoded.popleft()
                pending.append((first, runs, job.result().submit()))
                while pending and (len(pending) > SUBMITS_IN_FLIGHT or not encoded):
                    first, runs, launch = pending.popleft()
                    history = launch.result()["state"][2:]
                    for p in range(first, first + runs):
                        received += 1
                        self.position = start + received
                        yield int(history[p % STATE_HISTORY])
        finally:
            for _, _, job in encoded:
                job.cancel()
            worker.shutdown(wait=True)
            self.position = start + received

    def set_state(self, token: int, position: int) -> None:
        """Point the recorded decoding step at `token` at `position`, history cleared."""
        state = np.zeros(2 + STATE_HISTORY, np.int32)
        state[:2] = token, position
        self.state.write(state)

    def _checked(self, token_ids) -> np.ndarray:
        ids = np.asarray(list(token_ids), dtype=np.int64).reshape(-1)
        if ids.size == 0:
            raise ValueError("forward needs at least one token")
        if self.position + ids.size > self.context_length:
            raise ContextOverflowError(
                f"{self.position + ids.size} tokens do not fit in the context of "
                f"{self.context_length}; shorten the prompt or lower --max-tokens")
        if ids.min() < 0 or ids.max() >= self.config.vocab_size:
            raise ValueError(f"token ids must be in 0..{self.config.vocab_size - 1}")
        return ids.astype(np.int32)

    def _run(self, ids: np.ndarray, last_only: bool) -> np.ndarray:
        b = Batch(self.backend)
        logits = self.record(b, ids, last_only)
        b.execute()
        return b.read(logits)

    def _decode_step(self, position: int) -> Graph:
        """The recorded step for a token at `position` (recorded on first use)."""
        bound = step_bound(position, self.context_length)
        if bound not in self._steps:
            self._steps[bound] = Graph(self.backend,
                                       lambda b: self.record_step(b, max_keys=bound))
        return self._steps[bound]

    # ---- recording --------------------------------------------------------------------
    def record(self, b: Batch, token_ids, last_only: bool = True):
        """Queue the forward pass of `token_ids` on batch `b` (nothing runs until
        b.execute()); advances the position; returns the logits tensor."""
        ids = self._checked(token_ids)
        s, pos = ids.size, self.position
        state = b.upload(np.array([ids[-1], pos], np.int32))
        x = self._embed(b, b.upload(ids))
        x = self._layers(b, x, state, max_keys=pos + s)
        if last_only and s > 1:
            x = b.slice_rows(x, s - 1, s)
        self.position = pos + s
        return self._logits(b, x)

    def record_step(self, b: Batch, max_keys: int | None = None) -> dict:
        """Queue one decoding step driven by `self.state` = [token, position, history..]:
        the logits of that token, then state becomes [the token drawn, position + 1]
        with the token in history[position % STATE_HISTORY] too (drawn by sample_step
        with `self.sampler`: the argmax at temperature 0). Valid for positions below
        `max_keys` (default: the whole context)."""
        x = self._embed(b, self.state.prefix(1))
        logits = self._logits(b, self._layers(b, x, self.state,
                                              max_keys=max_keys or self.context_length))
        b.sample_step(logits, self.state, self.sampler)
        return {"logits": logits, "state": self.state}

    def _embed(self, b: Batch, ids):
        e = self.embedding
        return b.embedding_quant(ids, e.tensor, qtype=e.qtype, k=e.k)

    def _logits(self, b: Batch, x):
        o = self.output
        return b.rmsnorm_matmul_quant(x, self.output_norm, o.tensor, qtype=o.qtype, k=o.k,
                                      eps=self.config.norm_eps)

    def _layers(self, b: Batch, x, state, max_keys: int):
        cfg = self.config
        for i, layer in enumerate(self.layers):
            if i and x.shape[0] >= FLUSH_MIN_TOKENS:
                b.flush()  # the GPU runs the layers recorded so far while the host goes on
            qkv = self._normed_product(b, x, layer.attn_norm, layer.qkv)
            wo = layer.wo
            x = b.attention_cached_matmul_quant_add(
                qkv, self.k_cache[i], self.v_cache[i], state, wo.tensor, x,
                n_heads=cfg.n_heads, theta=cfg.rope_theta, style="interleaved",
                max_keys=max_keys, qtype=wo.qtype, k=wo.k)
            down = layer.w_down
            x = b.matmul_quant_add(self._swiglu(b, x, layer), down.tensor, x, qtype=down.qtype,
                                   k=down.k)
        return x

    def _normed_product(self, b: Batch, x, gain, parts: list[Matrix]):
        eps = self.config.norm_eps
        outs = [b.rmsnorm_matmul_quant(x, gain, m.tensor, qtype=m.qtype, k=m.k, eps=eps)
                for m in parts]
        joined = outs[0]
        for more in outs[1:]:
            joined = b.concat_columns(joined, more)
        return joined

    def _swiglu(self, b: Batch, x, layer: Layer):
        if len(layer.gate_up) == 1:
            m = layer.gate_up[0]
            return b.rmsnorm_swiglu_quant(x, layer.ffn_norm, m.tensor, qtype=m.qtype, k=m.k,
                                          eps=self.config.norm_eps)
        gate, up = (self._normed_product(b, x, layer.ffn_norm, [m]) for m in layer.gate_up)
        return b.mul(b.silu(gate), up)


def profile_decode_step(model: Model, repeats: int = 20) -> dict:
    """Where one decoded token's time goes: host time to encode and submit the recorded
    step, time until its result is back (GPU work plus the readback), the whole step's
    GPU time (timestamps around the pass), and the GPU time of every kernel (each
    dispatch timed alone, which adds a little time of its own)."""
    import statistics
    import time

    start = model.position
    step = model._decode_step(start)
    encode, wait = [], []
    for i in range(repeats + 1):
        model.set_state(1, start)
        t0 = time.perf_counter()
        launch = step.launch("state")
        t1 = time.perf_counter()
        launch.result()
        t2 = time.perf_counter()
        if i:
            encode.append(t1 - t0)
            wait.append(t2 - t1)
    model.set_state(1, start)
    timed = step.launch("state", timestamps=True)
    timed.result()
    model.set_state(1, start)
    b = Batch(model.backend, profile=True)
    model.record_step(b, max_keys=step_bound(start, model.context_length))
    b.execute()
    kernels: dict[str, float] = {}
    for label, seconds in b.profile or []:
        kernels[label] = kernels.get(label, 0.0) + seconds
    model.position = start
    ms = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731
    gpu = timed.gpu_seconds
    return {
        "dispatches_per_token": step.dispatches,
        "host_encode_submit_ms": ms(encode),
        "gpu_wait_and_readback_ms": ms(wait),
        "gpu_step_ms": None if gpu is None else round(gpu * 1e3, 3),
        "gpu_kernel_ms_total": round(sum(kernels.values()) * 1e3, 3),
        "gpu_kernel_ms_by_kernel": {k: round(v * 1e3, 3) for k, v in
                                    sorted(kernels.items(), key=lambda kv: -kv[1])},
    }


def _progress(items, enabled: bool, label: str):
    if not enabled:
        yield from items
        return
    from rich.progress import Progress

    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=len(items))
        for item in items:
            yield item
            bar.advance(task)


def load_model(path: str | None = None, backend="auto", progress: bool = True,
               max_context: int | None = None, warm_up: bool = False) -> Model:
    """Load a llama-family GGUF (default: SmolLM2-135M-Instruct) onto a backend; with
    `warm_up`, also compile its GPU kernels (Model.warm_up)."""
    model = Model(GGUFModelFile(path or default_model_path()), backend, progress, max_context)
    if warm_up:
        if progress:
            from rich.console import Console

            with Console(stderr=True).status("compiling GPU kernels"):
                model.warm_up()
        else:
            model.warm_up()
    return model
