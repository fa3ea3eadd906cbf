"""Prompts as captured graphs, where a backend's launches rather than its GPU are what a
prompt waits for (Backend.prompt_graphs: CUDA, where Python launching a 512-token
forward's kernels takes the host about twice the GPU's time, and WebGPU, where recording
them takes ~1.5 times; docs/benchmarks-log.md). The math
is the model's (`transformer`); this module only schedules it.

A prompt is cut into pieces of PIECE_TOKENS. The forward of a piece length met a second
time is recorded once as a Graph reading its tokens and state [last token, position]
from two device tensors, written before each run; its attention may see every position
of the cache (max_keys = the context), so one graph serves a piece at any position (the
position is read on the device, as decoding's steps read theirs). A long prompt's full
pieces share one graph; a length met once runs as before, so a one-off prompt pays no
recording. Graphs keep their intermediate results on the device: at most GRAPHS_KEPT
graphs, each of at most GRAPH_BYTES (a larger one is dropped and its length runs as
before).
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from typing import TYPE_CHECKING

import numpy as np

from ..core import Tensor
from ..batch import Graph

if TYPE_CHECKING:
    from .generate import LanguageModel

#: Tokens a prompt piece has at most (a long prompt's full pieces share a graph).
PIECE_TOKENS = 512
#: Shorter pieces run as before: their launches are few, and a graph's attention over
#: the whole context would cut their keys into ranges.
MIN_TOKENS = 64
#: Graphs kept (the most recently used), and the device memory one may keep.
GRAPHS_KEPT = 2
GRAPH_BYTES = 1 << 30


class PromptGraphs:
    """The recorded prompt pieces of one model, by piece length."""

    def __init__(self, model: "LanguageModel"):
        # weak: the graphs' recordings (kept here) must not keep a dropped model alive
        self._model = weakref.ref(model)
        self._seen: set[int] = set()
        self._too_large: set[int] = set()
        self._graphs: OrderedDict[int, tuple[Graph, Tensor, Tensor]] = OrderedDict()

    @property
    def lengths(self) -> list[int]:
        """The piece lengths recorded now, least recently used first."""
        return list(self._graphs)

    def logits(self, piece: np.ndarray, position: int) -> np.ndarray | None:
        """The logits (vocab,) of the last of `piece`'s tokens (int32) run at `position`
        by its graph, which also fills the KV cache; None where the caller runs the piece
        itself (a length met for the first time, a short or too large one)."""
        n = piece.size
        entry = self._graphs.get(n)
        if entry is None:
            if n < MIN_TOKENS or n in self._too_large or n not in self._seen:
                self._seen.add(n)
                return None
            entry = self._record(n)
            if entry is None:
                return None
        self._graphs.move_to_end(n)
        graph, tokens, state = entry
        tokens.write(piece)
        state.write(np.array([piece[-1], position], np.int32))
        return graph.launch("logits").result()["logits"][-1]

    def _record(self, n: int) -> tuple[Graph, Tensor, Tensor] | None:
        model = self._model()
        backend, positions = model.backend, model.context_length
        tokens = backend.from_numpy(np.zeros(n, np.int32))
        state = backend.from_numpy(np.zeros(2, np.int32))
        record = weakref.WeakMethod(model.record_piece)
        graph = Graph(backend, lambda: {"logits": record()(tokens, state, positions)})
        if (graph.scratch_bytes or 0) > GRAPH_BYTES:
            self._too_large.add(n)
            return None
        while len(self._graphs) >= GRAPHS_KEPT:
            self._graphs.popitem(last=False)
        self._graphs[n] = (graph, tokens, state)
        return self._graphs[n]
