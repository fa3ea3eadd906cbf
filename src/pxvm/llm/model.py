"""The transformer, written once over pxvm ops for every family (families.py) and every
backend (on the GPU with the weights resident and still quantized).

    x = embedding[tokens] (* sqrt(dim) for Gemma)
    for each layer:
        qkv = rmsnorm(x) @ [Wq; Wk; Wv] (+ bias; each q and k head rmsnorm'ed: QK norm)
        h = attention(rope(q), rope(k) -> cache, v -> cache) @ Wo
        x = x + h                      (x + rmsnorm(h): post-norm families)
        h = act(rmsnorm(x) @ Wgate) * (rmsnorm(x) @ Wup) @ Wdown   (act silu or GELU)
        x = x + h                      (x + rmsnorm(h): post-norm families)
    logits = rmsnorm(x) @ Wout (soft-capped where the family caps them)

Most lines are one fused op of pxvm.ops.transformer. The math records into the active
Batch: a prompt is one batch, a decoding step one recorded Graph, which decode.py
schedules. The cache is the model's own (CacheAttention: one sequence), or blocks of a
paged cache that many sequences share (PagedAttention: a step of engine.py's continuous
batching, one batch).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, replace
from typing import Callable

import numpy as np
from rich.console import Console
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from .. import ops
from ..core import Tensor, model_backend
from ..batch import Batch
from ..ops import decoding, transformer
from ..core.errors import PxvmError
from . import pixel_container
from .decode import FIRST_STEP_BOUND, ContextOverflowError, Decoder
from .gguf_model import (Config, FileSummary, GGUFModelFile, Weight, default_model_path,
                         read_summary)
from .prompts import PIECE_TOKENS, PromptGraphs
from .weights import (Footprint, WeightMatrix, byte_size, feed_forward_parts, joined_parts,
                      memory_bound, row_parts, uploaded_weight_bytes)

log = logging.getLogger("pxvm.llm")

#: Prompts of at least this many tokens are submitted layer by layer (Batch.flush), so
#: the GPU runs each layer while the host records the next: on the H100 recording a
#: 512-token prompt took the host as long as the GPU took to run it (docs/benchmarks-log.md).
#: The bound is a judgement: a short prompt's GPU time is small, so there is little to
#: overlap.
FLUSH_MIN_TOKENS = 64

#: Positions the KV cache keeps when the caller names no max_context: files declare
#: contexts of 128k and more (up to MAX_CONTEXT_LENGTH), whose cache would take many GB
#: before the first token. SmolLM2, the default model, has exactly 8192.
#: load_model(max_context=N) (pxvm's --context N) asks for more or fewer.
DEFAULT_MAX_CONTEXT = 8192
#: The largest KV cache (keys and values of every layer) a model may allocate.
MAX_KV_CACHE_BYTES = 16 << 30
#: What a model's KV cache holds (load_model's kv_cache): float32 ("f32") or float16
#: ("f16": half the bytes, so half what each decoded token's attention reads, for values
#: rounded to float16); "auto": float16 where the backend's attention kernels read it
#: (ops.transformer.cache_dtypes), else float32.
KV_CACHE_CHOICES = ("auto", *transformer.KV_CACHE_DTYPES)
#: Sliding-window layers keep their window and one pass's tokens in a ring cache
#: (transformer.cached_rows), so prompts are run PROMPT_CHUNK tokens a pass in models
#: that have them; the rest run a prompt in one pass.
PROMPT_CHUNK = 512


class ContextSizeError(PxvmError):
    """The context asked for is not a positive integer, or its KV cache is over
    MAX_KV_CACHE_BYTES, or a layer's cache over the largest tensor the backend takes;
    the message says how many positions fit."""


class KVCacheTypeError(PxvmError, ValueError):
    """kv_cache is not one of KV_CACHE_CHOICES, or names a type the backend's attention
    kernels do not read."""


def kv_cache_choice(asked) -> str:
    """load_model's `kv_cache`, one of KV_CACHE_CHOICES (any case), in lower case;
    KVCacheTypeError for anything else."""
    if not isinstance(asked, str) or asked.lower() not in KV_CACHE_CHOICES:
        raise KVCacheTypeError(f"kv_cache must be one of {', '.join(map(repr, KV_CACHE_CHOICES))}"
                               f", not {asked!r}")
    return asked.lower()


def kv_cache_type(backend, asked: str = "auto") -> str:
    """The KV cache's dtype name on `backend` ("f32" or "f16") for load_model's
    `kv_cache`: "auto" is "f16" where the backend's attention kernels read float16 caches,
    else "f32"; KVCacheTypeError for anything else or a type the backend does not read."""
    asked = kv_cache_choice(asked)
    takes = transformer.cache_dtypes(backend)
    if asked == "auto":
        return "f16" if "f16" in takes else "f32"
    if asked not in takes:
        raise KVCacheTypeError(f"the {backend.name} backend's attention reads KV caches of "
                               f"{' or '.join(takes)} only, not {asked}; ask for "
                               f"kv_cache='auto' (or --kv-cache auto)")
    return asked


def cache_rows(cfg: Config, positions: int) -> list[int]:
    """Each layer's KV cache rows for `positions` positions: all of them, or a
    sliding-window layer's ring (its window and one pass, transformer.cached_rows)."""
    return [transformer.cached_rows(cfg.window if i in cfg.local_layers else 0, PROMPT_CHUNK,
                                    positions) for i in range(cfg.n_layers)]


def kv_cache_bytes(cfg: Config, positions: int, kv_cache: str = "f32") -> int:
    """The bytes of a KV cache of `positions` positions: keys and values of every layer,
    of dtype `kv_cache` ("f32" or "f16")."""
    value_bytes = transformer.KV_CACHE_DTYPES[kv_cache].itemsize
    return 2 * sum(cache_rows(cfg, positions)) * cfg.n_kv_heads * cfg.head_dim * value_bytes


def kv_cache_positions(cfg: Config, max_context: int | None = None,
                       kv_cache: str = "f32") -> int:
    """The positions the KV cache keeps: the file's context, at most `max_context`
    (DEFAULT_MAX_CONTEXT when None); ContextSizeError when their cache, of dtype
    `kv_cache` ("f32" or "f16"), would be over MAX_KV_CACHE_BYTES."""
    asked = DEFAULT_MAX_CONTEXT if max_context is None else max_context
    if isinstance(asked, bool) or not isinstance(asked, (int, np.integer)) or asked < 1:
        raise ContextSizeError(f"max_context must be a positive integer, not {max_context!r}")
    positions = min(cfg.context_length, int(asked))
    value_bytes = transformer.KV_CACHE_DTYPES[kv_cache].itemsize
    needed = kv_cache_bytes(cfg, positions, kv_cache)
    if needed > MAX_KV_CACHE_BYTES:
        row = 2 * cfg.n_kv_heads * cfg.head_dim * value_bytes  # a layer's keys and values of a position
        rings = len(cfg.local_layers)  # sliding-window layers, whose caches stay small
        ring_bytes = rings * row * transformer.cached_rows(cfg.window, PROMPT_CHUNK, positions)
        fit = (MAX_KV_CACHE_BYTES - ring_bytes) // max((cfg.n_layers - rings) * row, 1)
        raise ContextSizeError(
            f"a KV cache of {positions:,} positions needs {needed:,} bytes (2 x "
            f"{cfg.n_layers - rings} full-context layers x {cfg.n_kv_heads} kv heads x head "
            f"size {cfg.head_dim} x {value_bytes} bytes ({kv_cache}) per position, plus the "
            f"sliding-window layers' rings), over the bound of {MAX_KV_CACHE_BYTES:,}; at "
            f"most {fit:,} positions fit: ask for a smaller context (max_context, --context)"
            + (" or a float16 cache (kv_cache='f16', --kv-cache f16)"
               if kv_cache == "f32" else ""))
    return positions


def positions_that_fit(cfg: Config, most: int, kv_cache: str, room: int) -> int:
    """The most positions, up to `most`, whose KV cache takes at most `room` bytes (at
    least 1: a model whose weights leave no room is then refused by Footprint.check)."""
    low, high = 1, most
    while low < high:  # the cache grows with the positions: the last that fits
        mid = (low + high + 1) // 2
        if kv_cache_bytes(cfg, mid, kv_cache) <= room:
            low = mid
        else:
            high = mid - 1
    return low


def summarize(path: str) -> FileSummary:
    """What `pxvm models` says of the GGUF file at `path` (gguf_model.read_summary), with
    the KV cache of the default context where pxvm runs it; ModelFileError when it is no
    GGUF file one can read."""
    summary, file = read_summary(path)
    if file is None:
        return summary
    positions = min(file.config.context_length, DEFAULT_MAX_CONTEXT)
    return replace(summary, kv_cache_positions=positions, kv_cache_bytes={
        name: kv_cache_bytes(file.config, positions, name) for name in transformer.KV_CACHE_DTYPES})


def check_cache_tensors(backend, rows: list[int], row_bytes: int) -> None:
    """ContextSizeError when a layer's KV cache, `rows` rows of `row_bytes`, is over the
    largest tensor the backend takes (the caches are not split into parts)."""
    limit = backend.max_tensor_bytes
    if limit is not None and max(rows) * row_bytes > limit:
        fit = limit // row_bytes
        advice = (f"at most {fit:,} positions fit: ask for a smaller context (max_context, "
                  f"--context {fit})" if fit else "run the model on another backend (--backend)")
        raise ContextSizeError(
            f"a layer's KV cache of {max(rows):,} positions takes {max(rows) * row_bytes:,} "
            f"bytes, more than the largest tensor {backend.describe()} takes ({limit:,} "
            f"bytes); {advice}")


@dataclass
class LayerWeights:
    """A layer's weights; each matrix a list of row parts (weights.py), one part where
    the backend takes the whole matrix in one tensor."""

    attn_norm: Tensor
    wqkv: list[WeightMatrix]       # [Wq; Wk; Wv] rows, joined per run of one tensor type
    wo: list[WeightMatrix]
    ffn_norm: Tensor
    w_gate_up: list[WeightMatrix]  # [Wgate; Wup] as GLU parts where of one type, else []
    w_gate: list[WeightMatrix]     # else Wgate and Wup apart (files that mix types)
    w_up: list[WeightMatrix]
    w_down: list[WeightMatrix]
    qkv_bias: Tensor | None = None        # [bq; bk; bv] (Qwen2)
    q_norm: Tensor | None = None          # QK norm's gains (Qwen3, Gemma 3)
    k_norm: Tensor | None = None
    post_attn_norm: Tensor | None = None  # post-norms (Gemma 2, 3)
    post_ffn_norm: Tensor | None = None


class Model:
    """A loaded model with its KV cache. `forward(tokens)` runs them at the current
    position and returns the last position's logits; `decode` chains decoding steps on
    the device."""

    def __init__(self, file: GGUFModelFile, backend="auto", progress: bool = True,
                 max_context: int | None = None, kv_cache: str = "auto"):
        self.file = file
        self.config: Config = file.config
        self.metadata = file.metadata
        kv_cache_choice(kv_cache)  # a bad value fails before a backend is chosen
        self.backend, self.backend_reason = model_backend(backend)
        if self.backend_reason:
            log.info("pxvm: the model runs on %s (%s)", self.backend.name, self.backend_reason)
        self.backend_name = self.backend.name
        self.device_name = self.backend.describe()
        cfg = self.config
        #: the KV cache's dtype name, "f32" or "f16" (kv_cache_type)
        self.kv_cache = kv_cache_type(self.backend, kv_cache)
        weight_bytes = uploaded_weight_bytes(file)
        #: why the cache holds fewer positions than the default context (None: it does not)
        self.context_reason: str | None = None
        self.context_length = self._positions(max_context, weight_bytes)
        #: each layer's attention_cached parameters (RoPE, window, soft-cap, scale)
        self.attention = [cfg.attention(i, self.context_length) for i in range(cfg.n_layers)]
        rows = cache_rows(cfg, self.context_length)
        self.prompt_chunk = PROMPT_CHUNK if min(rows) < self.context_length else None
        dtype = transformer.KV_CACHE_DTYPES[self.kv_cache]
        row_bytes = cfg.n_kv_heads * cfg.head_dim * np.dtype(dtype).itemsize  # a position's keys
        check_cache_tensors(self.backend, rows, row_bytes)
        #: the device memory the model takes, checked before anything is loaded
        self.footprint = Footprint(weight_bytes, 2 * sum(rows) * row_bytes,
                                   self.context_length)
        self.footprint.check(self.backend)
        log.info("pxvm: loading %s: %s (KV cache %s)", file.path, self.footprint, self.kv_cache)
        with self.footprint.uploading(self.backend):
            self._load_weights(file, progress)
            # zeros made on the device (host backends: pages mapped as they are written)
            self.k_cache = [self.backend.zeros((n, cfg.n_kv_heads, cfg.head_dim), dtype)
                            for n in rows]
            self.v_cache = [self.backend.zeros((n, cfg.n_kv_heads, cfg.head_dim), dtype)
                            for n in rows]
        self.position = 0
        self.decoder = Decoder(self)
        #: prompts replayed as graphs where the backend gains by it (rings excluded: a
        #: sliding-window cache's rows depend on the pass)
        self.prompt_graphs = (PromptGraphs(self) if self.backend.prompt_graphs
                              and self.prompt_chunk is None else None)

    def _positions(self, max_context: int | None, weight_bytes: int) -> int:
        """The KV cache's positions: `max_context` (at most the file's context), or the
        default context, fewer where its cache would not fit in the share of the
        device's free memory left beside the weights (weights.MEMORY_SHARE)."""
        positions = kv_cache_positions(self.config, max_context, self.kv_cache)
        memory = self.backend.memory_bytes()
        if max_context is not None or memory is None:
            return positions
        room = memory_bound(memory) - weight_bytes
        fit = positions_that_fit(self.config, positions, self.kv_cache, room)
        if fit < positions:
            self.context_reason = (
                f"a KV cache of {positions:,} positions would take "
                f"{byte_size(kv_cache_bytes(self.config, positions, self.kv_cache))}, more "
                f"than the {byte_size(max(room, 0))} of memory left beside the weights; the "
                f"context holds {fit:,} positions (--context to ask for another)")
        return fit

    # ---- weights ------------------------------------------------------------------------
    def _load_weights(self, file: GGUFModelFile, progress: bool) -> None:
        cfg, backend = self.config, self.backend
        self.layers: list[LayerWeights] = []
        label = (f"loading {cfg.n_layers} layers to {self.backend.name} (weights "
                 f"{byte_size(self.footprint.weights)}, KV cache "
                 f"{byte_size(self.footprint.kv_cache)} for {self.context_length:,} positions)")
        fam = cfg.family
        for i in _progress(range(cfg.n_layers), progress, label):
            w = lambda name, part="weight": file.weight(f"blk.{i}.{name}.{part}")  # noqa: E731
            vector = lambda name, part="weight", has=True: (  # noqa: E731
                self._vector(w(name, part)) if has else None)
            qkv = ["attn_qkv"] if fam.fused_qkv else ["attn_q", "attn_k", "attn_v"]
            gate_up = ["ffn_up"] if fam.fused_gate_up else ["ffn_gate", "ffn_up"]
            w_gate_up, w_gate, w_up = feed_forward_parts(backend, [w(n) for n in gate_up])
            self.layers.append(LayerWeights(
                attn_norm=vector("attn_norm"),
                wqkv=joined_parts(backend, [w(name) for name in qkv]),
                wo=row_parts(backend, [w("attn_output")]),
                ffn_norm=vector("ffn_norm"),
                w_gate_up=w_gate_up, w_gate=w_gate, w_up=w_up,
                w_down=row_parts(backend, [w("ffn_down")]),
                qkv_bias=(self._joined_vector([w(n, "bias") for n in qkv])
                          if fam.qkv_bias else None),
                q_norm=vector("attn_q_norm", has=fam.qk_norm),
                k_norm=vector("attn_k_norm", has=fam.qk_norm),
                post_attn_norm=vector("post_attention_norm", has=fam.post_norms),
                post_ffn_norm=vector("post_ffw_norm", has=fam.post_norms)))
        self.embedding = row_parts(backend, [file.weight("token_embd.weight")])
        self.output_norm = self._vector(file.weight("output_norm.weight"))
        self.output = (self.embedding if cfg.tied_output
                       else row_parts(backend, [file.weight("output.weight")]))

    def _vector(self, w: Weight) -> Tensor:
        return self.backend.from_numpy(np.asarray(w.data, np.float32))

    def _joined_vector(self, weights: list[Weight]) -> Tensor:
        return self.backend.from_numpy(np.concatenate([np.asarray(w.data, np.float32)
                                                       for w in weights]))

    # ---- the math (recorded into the active batch) --------------------------------------
    def transformer(self, tokens: Tensor, attention: "CacheAttention | PagedAttention",
                    last_rows: int | None = None,
                    after_layer: Callable[[], object] | None = None) -> Tensor:
        """Logits of `tokens` (int32 ids on the device), one row per token, or of the last
        `last_rows` tokens only; `attention` is where each layer's keys and values go and
        come from (the model's own cache, or blocks of a paged one). `after_layer` runs
        between layers (a prompt's batch flushes there)."""
        cfg = self.config
        x = None  # the sum of the table parts' lookups (each gives its rows, zeros elsewhere)
        for e in self.embedding:
            rows = ops.embedding_quant(tokens, e.tensor, qtype=e.qtype, k=e.k,
                                       first_row=e.first_row)
            x = rows if x is None else ops.add(x, rows)
        if cfg.embedding_scale != 1.0:
            x = ops.scale(x, cfg.embedding_scale)
        for i, layer in enumerate(self.layers):
            if i and after_layer is not None:
                after_layer()
            x = self.layer(x, layer, i, attention)
        if last_rows is not None and last_rows < x.shape[0]:
            x = ops.slice_rows(x, x.shape[0] - last_rows, x.shape[0])
        logits = self.normed_product(x, self.output_norm, self.output)
        if cfg.final_softcap:
            cap = cfg.final_softcap
            logits = ops.scale(ops.tanh(ops.scale(logits, 1.0 / cap)), cap)
        return logits

    def layer(self, x: Tensor, w: LayerWeights, i: int,
              attention: "CacheAttention | PagedAttention") -> Tensor:
        """Layer i: norm -> attention -> residual -> norm -> feed-forward -> residual,
        with the family's extras."""
        cfg = self.config
        qkv = self.normed_product(x, w.attn_norm, w.wqkv)
        if w.qkv_bias is not None:
            qkv = ops.add(qkv, w.qkv_bias)
        if w.q_norm is not None:
            qkv = transformer.qk_norm(qkv, w.q_norm, w.k_norm, n_heads=cfg.n_heads,
                                      n_kv_heads=cfg.n_kv_heads, eps=cfg.norm_eps)
        x = attention.attend(i, qkv, x, w)
        h = self.feed_forward_in(x, w)
        if w.post_ffn_norm is None and len(w.w_down) == 1:
            w_down = w.w_down[0]
            return transformer.matmul_quant_add(h, w_down.tensor, x, qtype=w_down.qtype,
                                                k=w_down.k)
        return self.residual_add(x, self.product(h, w.w_down), w.post_ffn_norm)

    def residual_add(self, x: Tensor, h: Tensor, post_norm: Tensor | None) -> Tensor:
        """x + h, or x + rmsnorm(h) in post-norm families."""
        if post_norm is not None:
            h = ops.rmsnorm(h, post_norm, eps=self.config.norm_eps)
        return ops.add(x, h)

    def product(self, x: Tensor, parts: list[WeightMatrix]) -> Tensor:
        """x @ [W1; W2; ..]^T (one product per part, columns joined)."""
        return _joined_columns([ops.matmul_quant(x, m.tensor, qtype=m.qtype, k=m.k)
                                for m in parts])

    def normed_product(self, x: Tensor, gain: Tensor, parts: list[WeightMatrix]) -> Tensor:
        """rmsnorm(x, gain) @ [W1; W2; ..]^T (one product per part, columns joined)."""
        eps = self.config.norm_eps
        return _joined_columns([transformer.rmsnorm_matmul_quant(x, gain, m.tensor,
                                                                 qtype=m.qtype, k=m.k, eps=eps)
                                for m in parts])

    def feed_forward_in(self, x: Tensor, w: LayerWeights) -> Tensor:
        """act(h @ Wgate^T) * (h @ Wup^T) for h = rmsnorm(x, ffn_norm), act the family's
        (silu: SwiGLU, gelu_tanh: GeGLU): one GLU op per part of [Wgate; Wup] (each
        part's outputs its columns), or the gate's and the up projection's products."""
        activation, eps = self.config.family.activation, self.config.norm_eps
        if w.w_gate_up:
            return _joined_columns([transformer.rmsnorm_glu_quant(
                x, w.ffn_norm, m.tensor, qtype=m.qtype, k=m.k, eps=eps, activation=activation)
                for m in w.w_gate_up])
        gate = self.normed_product(x, w.ffn_norm, w.w_gate)
        up = self.normed_product(x, w.ffn_norm, w.w_up)
        return ops.mul(getattr(ops, activation)(gate), up)

    def record_step(self, state: Tensor, sampler: Tensor, max_keys: int) -> dict[str, Tensor]:
        """One decoding step driven by `state` = [token, position, history..]: the logits
        of that token; then state becomes [the token drawn, position + 1], the token also
        in its history (decoding.sample_step with `sampler`: the argmax at temperature
        0). Valid at positions below `max_keys`."""
        logits = self.transformer(state.prefix(1), CacheAttention(self, state, max_keys))
        decoding.sample_step(logits, state, sampler)
        return {"logits": logits, "state": state}

    def record_piece(self, tokens: Tensor, state: Tensor, max_keys: int) -> Tensor:
        """The last logits of a prompt's piece `tokens` at positions from state[1] (a
        recorded graph of prompts.py). Valid while those positions stay below `max_keys`."""
        return self.transformer(tokens, CacheAttention(self, state, max_keys), last_rows=1)

    # ---- running ------------------------------------------------------------------------
    def forward(self, token_ids) -> np.ndarray:
        """Run `token_ids` at the current position; logits (vocab,) of the last one."""
        ids = self._checked(token_ids)
        if ids.size > 1:
            return self._prompt(ids, last_only=True)[-1]
        logits = self.decoder.logits(int(ids[0]))
        self.position += 1
        return logits

    def forward_all(self, token_ids) -> np.ndarray:
        """As forward, but the logits of every position: (len(token_ids), vocab)."""
        return self._prompt(self._checked(token_ids), last_only=False)

    def decode(self, token: int, n: int, temperature: float = 0.0, seed: int = 0):
        """Feed `token`, then keep feeding the token drawn from each step's logits (the
        argmax at temperature 0): yields the n tokens chosen (decode.Decoder.run)."""
        self._checked([token])
        yield from self.decoder.run(token, n, temperature, seed)

    def decode_greedy(self, token: int, n: int):
        """decode at temperature 0."""
        return self.decode(token, n)

    def reset(self) -> None:
        """Forget the conversation: the next forward starts at position 0."""
        self.position = 0

    def paged_cache(self, block_size: int, blocks: int | None = None,
                    sequences: int = 1) -> PagedCache:
        """A paged KV cache (PagedCache) of `blocks` blocks of `block_size` positions, of
        the model's KV cache dtype; when None, as many as `sequences` sequences of the
        whole context take, at most what fits (MAX_KV_CACHE_BYTES, MEMORY_SHARE of the
        free memory, the largest tensor); ContextSizeError when not one block fits."""
        cfg = self.config
        dtype = self._paged_dtype()
        row_bytes = cfg.n_kv_heads * cfg.head_dim * np.dtype(dtype).itemsize
        block_bytes = 2 * cfg.n_layers * block_size * row_bytes  # every layer's keys and values
        if blocks is None:
            room = MAX_KV_CACHE_BYTES
            if (memory := self.backend.memory_bytes()) is not None:
                room = min(room, memory_bound(memory))
            if (limit := self.backend.max_tensor_bytes) is not None:
                room = min(room, limit // (block_size * row_bytes) * block_bytes)
            blocks = min(sequences * -(-self.context_length // block_size), room // block_bytes)
            if blocks < 1:
                raise ContextSizeError(f"not one KV block of {block_size} positions "
                                       f"({byte_size(block_bytes)}) fits beside the model")
        check_cache_tensors(self.backend, [blocks * block_size], row_bytes)
        footprint = Footprint(0, blocks * block_bytes, blocks * block_size)
        footprint.check(self.backend)
        shape = (blocks, block_size, cfg.n_kv_heads, cfg.head_dim)
        with footprint.uploading(self.backend):
            return PagedCache([self.backend.zeros(shape, dtype) for _ in self.layers],
                              [self.backend.zeros(shape, dtype) for _ in self.layers])

    def _paged_dtype(self) -> np.dtype:
        """The paged cache's dtype: the model's KV cache's where attention_paged reads it
        on this backend, else float32; MissingKernelError where it reads neither."""
        for name in dict.fromkeys([self.kv_cache, "f32"]):
            dtype = transformer.KV_CACHE_DTYPES[name]
            if transformer.attention_paged.takes(self.backend, {"k_pool": dtype,
                                                                 "v_pool": dtype}):
                return dtype
        raise ops.MissingKernelError(
            f"the {self.backend_name} backend has no attention_paged kernel yet, which "
            f"batched generation needs", other_backend="cpu")

    def forward_paged(self, cache: PagedCache, token_ids: np.ndarray, token_table: np.ndarray,
                      block_table: np.ndarray, last_rows: int) -> np.ndarray:
        """One pass over tokens of many sequences through a paged cache (PagedAttention's
        tables, int32): the logits (last_rows, vocab) of the last `last_rows` tokens."""
        with Batch(self.backend) as batch:
            attention = PagedAttention(self, cache, batch.upload(token_table),
                                       batch.upload(block_table))
            logits = self.transformer(
                batch.upload(np.asarray(token_ids, np.int32)), attention, last_rows=last_rows,
                after_layer=batch.flush if len(token_ids) >= FLUSH_MIN_TOKENS else None)
        batch.execute()
        return batch.read(logits)

    def record_paged(self, cache: PagedCache, token_ids: Tensor, token_table: Tensor,
                     block_table: Tensor) -> Tensor:
        """forward_paged's logits of every token, from tensors on the device (the graph
        of a decoding step, paged_steps.py)."""
        return self.transformer(token_ids, PagedAttention(self, cache, token_table,
                                                          block_table))

    def warm_up(self) -> None:
        """Compile the kernels and record the decoding steps that a generation uses, so
        that its first tokens are not timed with them (docs/benchmarks-log.md: first use). A
        prompt of up to 65 tokens (several key ranges, then a merge pass), one decoding
        step run after it (ranges merged by the output projection) and the first span's
        step recorded (one range) reach every kernel variant. The CPU's kernels are
        compiled per argument types, not per range count, which a prompt of two tokens
        reaches: a longer one would only cost time (a 1B model's 65 tokens: seconds).
        Leaves the cache empty."""
        if not self.backend.compiles_on_first_use:
            return
        self.reset()
        prompt = 2 if self.backend.host_arrays else FIRST_STEP_BOUND + 1
        self.forward([0] * max(1, min(prompt, self.context_length - 1)))
        self.forward([0])
        self.decoder.step(0)
        self.reset()

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

    def _prompt(self, ids: np.ndarray, last_only: bool) -> np.ndarray:
        """The logits of a prompt's tokens at the current position (of its last only
        where `last_only`): in pieces of recorded graphs where the model has them
        (pxvm.llm.prompts), else recorded anew."""
        if not last_only or self.prompt_graphs is None:
            return self._recorded_prompt(ids, last_only)
        pos = self.position
        for start in range(0, ids.size, PIECE_TOKENS):
            piece = ids[start:start + PIECE_TOKENS]
            logits = self.prompt_graphs.logits(piece, pos + start)
            if logits is None:
                self.position = pos + start
                logits = self._recorded_prompt(piece, last_only=True)[-1]
        self.position = pos + ids.size
        return logits[None]

    def _recorded_prompt(self, ids: np.ndarray, last_only: bool) -> np.ndarray:
        """_prompt as one batch (of passes of at most prompt_chunk tokens, where
        sliding-window layers keep rings)."""
        s, pos = ids.size, self.position
        chunk = self.prompt_chunk or s
        with Batch(self.backend) as batch:
            parts = []
            for start in range(0, s, chunk):
                piece = ids[start:start + chunk]
                last = start + chunk >= s
                state = batch.upload(np.array([piece[-1], pos + start], np.int32))
                logits = self.transformer(
                    batch.upload(piece), CacheAttention(self, state, pos + start + piece.size),
                    last_rows=1 if last_only else None,
                    after_layer=batch.flush if piece.size >= FLUSH_MIN_TOKENS else None)
                if last or not last_only:
                    parts.append(logits)
        batch.execute()
        self.position = pos + s
        return np.concatenate([batch.read(part) for part in parts])


class CacheAttention:
    """Attention through the model's own KV cache: one sequence's tokens at positions
    from state[1] (attention_cached), seeing keys below `max_keys`."""

    def __init__(self, model: Model, state: Tensor, max_keys: int):
        self.model, self.state, self.max_keys = model, state, max_keys

    def attend(self, i: int, qkv: Tensor, x: Tensor, w: LayerWeights) -> Tensor:
        """x + layer i's attention @ Wo (x + rmsnorm(..): post-norm families); one op with
        the product and the residual where Wo is one tensor."""
        model = self.model
        caches = model.k_cache[i], model.v_cache[i], self.state
        params = dict(n_heads=model.config.n_heads, max_keys=self.max_keys, **model.attention[i])
        if w.post_attn_norm is None and len(w.wo) == 1:
            wo = w.wo[0]
            return transformer.attention_cached_matmul_quant_add(
                qkv, *caches, wo.tensor, x, qtype=wo.qtype, k=wo.k, **params)
        h = transformer.attention_cached(qkv, *caches, **params)
        return model.residual_add(x, model.product(h, w.wo), w.post_attn_norm)


@dataclass
class PagedCache:
    """The keys and values of many sequences, in blocks of `block_size` positions of one
    pool per layer, (blocks, block_size, Hkv, D): which blocks hold a sequence is its
    block table's (kv_blocks.BlockManager)."""

    k_pools: list[Tensor]
    v_pools: list[Tensor]

    @property
    def blocks(self) -> int:
        return self.k_pools[0].shape[0]

    @property
    def block_size(self) -> int:
        return self.k_pools[0].shape[1]


class PagedAttention:
    """Attention of a batch of sequences' tokens through a paged cache (attention_paged):
    token t is sequence token_table[t, 0]'s at position token_table[t, 1], and row b of
    block_table lists the blocks of sequence b."""

    def __init__(self, model: Model, cache: PagedCache, token_table: Tensor,
                 block_table: Tensor):
        self.model, self.cache = model, cache
        self.token_table, self.block_table = token_table, block_table

    def attend(self, i: int, qkv: Tensor, x: Tensor, w: LayerWeights) -> Tensor:
        """x + layer i's attention @ Wo (x + rmsnorm(..): post-norm families)."""
        model = self.model
        h = transformer.attention_paged(qkv, self.cache.k_pools[i], self.cache.v_pools[i],
                                        self.token_table, self.block_table,
                                        n_heads=model.config.n_heads, **model.attention[i])
        return model.residual_add(x, model.product(h, w.wo), w.post_attn_norm)


def _joined_columns(outs: list[Tensor]) -> Tensor:
    """[out1 out2 ..]: the products of a matrix's row parts side by side."""
    joined = outs[0]
    for more in outs[1:]:
        joined = ops.concat_columns(joined, more)
    return joined


def _progress(items, enabled: bool, label: str):
    if not enabled:
        yield from items
        return
    with Progress(transient=True) as bar:
        task = bar.add_task(label, total=len(items))
        for item in items:
            yield item
            bar.advance(task)


def open_model_file(path: str | os.PathLike | None = None) -> GGUFModelFile:
    """The model at `path`: a GGUF file, or a pixel container's folder (`pxvm pixels
    pack`), whose images are decoded into the same bytes; None: the default model."""
    if path is not None and pixel_container.is_container(path):
        return pixel_container.read_model_file(path)
    return GGUFModelFile(path or default_model_path())


def load_model(path: str | GGUFModelFile | None = None, backend="auto", progress: bool = True,
               max_context: int | None = None, warm_up: bool = False,
               kv_cache: str = "auto") -> Model:
    """Load a GGUF model of a family pxvm runs (families.py; default: SmolLM2-135M-Instruct)
    from its path (a .gguf file or a pixel container's folder) or its file already opened, onto a backend, with a KV cache of the
    file's context, at most `max_context` positions (when None: DEFAULT_MAX_CONTEXT, or
    fewer where their cache would not fit in memory: Model.context_reason says so), of
    `kv_cache` values: "f32", "f16" (half the bytes; keys and values rounded to float16)
    or "auto" (f16 where the backend's attention reads it, else f32: Model.kv_cache says
    which); with `warm_up`, also compile its kernels (Model.warm_up)."""
    kv_cache_choice(kv_cache)  # before the file is read
    file = path if isinstance(path, GGUFModelFile) else open_model_file(path)
    model = Model(file, backend, progress, max_context, kv_cache)
    if warm_up and progress:
        what = "GPU kernels" if model.backend_name != "cpu" else (
            "CPU kernels (the first time: compiled, then cached on disk)")
        if model.backend.is_software:
            what += (" on a software GPU, which compiles them on the CPU: a few minutes "
                     "(--backend cpu runs the model on the CPU much sooner)")
        with Progress(SpinnerColumn(), TextColumn(f"preparing the {what}"),
                      TimeElapsedColumn(), console=Console(stderr=True), transient=True) as bar:
            bar.add_task("", total=None)
            model.warm_up()
    elif warm_up:
        model.warm_up()
    return model
