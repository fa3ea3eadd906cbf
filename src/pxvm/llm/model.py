"""The llama-family transformer, written once over pxvm ops so that the same code runs on
the WebGPU backend (one submit per forward call, weights resident and still quantized)
and on the numpy backend."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..backends import get_backend
from ..batch import Batch
from ..runtime.errors import PxvmError
from .gguf_model import Config, GGUFModelFile, Weight, default_model_path


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
    wq: Matrix
    wk: Matrix
    wv: Matrix
    wo: Matrix
    ffn_norm: object
    w_gate: Matrix
    w_up: Matrix
    w_down: Matrix


class Model:
    """A loaded model with its KV cache. `forward(tokens)` runs them at the current
    position and returns the last position's logits."""

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
        loaded = {}
        for name in _progress(names, progress, f"loading {cfg.n_layers} layers to {self.backend.name}"):
            loaded[name] = self._upload(file.weight(name))
        self.embedding = loaded["token_embd.weight"]
        self.output_norm = loaded["output_norm.weight"]
        self.output = self.embedding if cfg.tied_output else loaded["output.weight"]
        self.layers = []
        for i in range(cfg.n_layers):
            w = lambda n: loaded[f"blk.{i}.{n}.weight"]  # noqa: E731
            self.layers.append(Layer(w("attn_norm"), w("attn_q"), w("attn_k"), w("attn_v"),
                                     w("attn_output"), w("ffn_norm"), w("ffn_gate"), w("ffn_up"),
                                     w("ffn_down")))
        kv_shape = (self.context_length, cfg.n_kv_heads, cfg.head_dim)
        zeros = np.zeros(kv_shape, np.float32)
        self.k_cache = [self.backend.from_numpy(zeros) for _ in range(cfg.n_layers)]
        self.v_cache = [self.backend.from_numpy(zeros) for _ in range(cfg.n_layers)]
        self.position = 0

    def _upload(self, w: Weight):
        if len(w.shape) == 1:
            return self.backend.from_numpy(np.asarray(w.data, np.float32))
        rows = np.ascontiguousarray(w.data).view(np.uint8).reshape(w.shape[0], -1)
        return Matrix(self.backend.from_numpy(rows), w.qtype, w.shape[1])

    def reset(self) -> None:
        """Forget the conversation: the next forward starts at position 0."""
        self.position = 0

    def forward(self, token_ids) -> np.ndarray:
        """Run `token_ids` at the current position; logits (vocab,) of the last one."""
        return self._run(token_ids, last_only=True)[-1]

    def forward_all(self, token_ids) -> np.ndarray:
        """As forward, but the logits of every position: (len(token_ids), vocab)."""
        return self._run(token_ids, last_only=False)

    def _run(self, token_ids, last_only: bool) -> np.ndarray:
        b = Batch(self.backend)
        logits = self.record(b, token_ids, last_only)
        b.execute()
        return b.read(logits)

    def record(self, b: Batch, token_ids, last_only: bool = True):
        """Queue the forward pass of `token_ids` on batch `b` (nothing runs until
        b.execute()); advances the position; returns the logits tensor."""
        ids = np.asarray(list(token_ids), dtype=np.int32).reshape(-1)
        cfg = self.config
        s, pos = ids.size, self.position
        if s == 0:
            raise ValueError("forward needs at least one token")
        if pos + s > self.context_length:
            raise ContextOverflowError(
                f"{pos + s} tokens do not fit in the context of {self.context_length}; "
                "shorten the prompt or lower --max-tokens")
        if ids.min() < 0 or ids.max() >= cfg.vocab_size:
            raise ValueError(f"token ids must be in 0..{cfg.vocab_size - 1}")
        x = b.embedding_quant(b.upload(ids), self.embedding.tensor, qtype=self.embedding.qtype,
                              k=self.embedding.k)
        hq, hkv, d = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        for i, layer in enumerate(self.layers):
            h = b.rmsnorm(x, layer.attn_norm, cfg.norm_eps)
            q = _linear(b, h, layer.wq).reshape(s, hq, d)
            k = _linear(b, h, layer.wk).reshape(s, hkv, d)
            v = _linear(b, h, layer.wv).reshape(s, hkv, d)
            q = b.rope(q, pos, cfg.rope_theta, "interleaved")
            k = b.rope(k, pos, cfg.rope_theta, "interleaved")
            b.write_rows(self.k_cache[i], k, pos)
            b.write_rows(self.v_cache[i], v, pos)
            att = b.attention(q, self.k_cache[i].prefix(pos + s), self.v_cache[i].prefix(pos + s),
                              causal=True)
            x = b.add(x, _linear(b, att.reshape(s, hq * d), layer.wo))
            h = b.rmsnorm(x, layer.ffn_norm, cfg.norm_eps)
            gated = b.mul(b.silu(_linear(b, h, layer.w_gate)), _linear(b, h, layer.w_up))
            x = b.add(x, _linear(b, gated, layer.w_down))
        if last_only and s > 1:
            x = b.slice_rows(x, s - 1, s)
        self.position = pos + s
        return _linear(b, b.rmsnorm(x, self.output_norm, cfg.norm_eps), self.output)


def profile_decode_step(model: Model, repeats: int = 5) -> dict:
    """Where one decoded token's time goes: host time to record the dispatches, to submit,
    and to read the logits back (wall clock), and the GPU time of every kernel (timestamp
    queries around each dispatch, which add a little time of their own)."""
    import statistics
    import time

    start = model.position
    record, submit, read, kernels, dispatches = [], [], [], {}, 0
    for i in range(repeats + 1):
        model.position = start
        t0 = time.perf_counter()
        b = Batch(model.backend)
        logits = model.record(b, [1])
        t1 = time.perf_counter()
        b.execute()
        model.backend.device.wait()
        t2 = time.perf_counter()
        b.read(logits)
        t3 = time.perf_counter()
        if i:
            record.append(t1 - t0)
            submit.append(t2 - t1)
            read.append(t3 - t2)
    model.position = start
    b = Batch(model.backend, profile=True)
    model.record(b, [1])
    b.execute()
    for label, seconds in b.profile or []:
        kernels[label] = kernels.get(label, 0.0) + seconds
        dispatches += 1
    model.position = start
    ms = lambda xs: round(statistics.median(xs) * 1e3, 3)  # noqa: E731
    return {
        "dispatches_per_token": dispatches,
        "host_record_ms": ms(record),
        "submit_and_gpu_wait_ms": ms(submit),
        "readback_ms": ms(read),
        "gpu_kernel_ms_total": round(sum(kernels.values()) * 1e3, 3),
        "gpu_kernel_ms_by_kernel": {k: round(v * 1e3, 3) for k, v in
                                    sorted(kernels.items(), key=lambda kv: -kv[1])},
    }


def _linear(b: Batch, x, w: Matrix):
    return b.matmul_quant(x, w.tensor, qtype=w.qtype, k=w.k)


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
               max_context: int | None = None) -> Model:
    """Load a llama-family GGUF (default: SmolLM2-135M-Instruct) onto a backend."""
    return Model(GGUFModelFile(path or default_model_path()), backend, progress, max_context)
