"""How the engine's steps run on a model's paged KV cache. A step that only decodes (one
token of each of B sequences, each sampling) runs as a Graph recorded once per padded
batch size (graph_sizes) and block table width (a power of two of blocks: attention's
grid covers the keys the table can hold, as decode.py's steps cover a span's), reading
its tokens and tables from device tensors written before each launch: launching a
recorded step costs the host a fraction of recording it anew (on CUDA, Python launching
a forward's kernels takes longer than the GPU runs them at small batches:
docs/benchmarks-log.md). Padding tokens are sequences of their own at position 0 of a
scratch block no sequence holds, so they write and read nothing else; their logits are
dropped. Steps with prompt chunks, whose shapes vary, are recorded anew
(Model.forward_paged). The math is the model's; this module only schedules it.

A graph also takes its tokens' argmax and, where the backend has
ops.decoding.advance_tokens, ends by making its inputs the next step's (each token its
argmax, one position further): `chain()` then launches the same step again without the
host, while the host reads the previous step's tokens (the engine's greedy decoding).
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from .. import ops
from ..batch import Graph, Launch
from ..core import Tensor
from .model import Model, PagedCache


#: Decoding graphs kept (the most recently used): each keeps its intermediate results on
#: the device.
GRAPHS_KEPT = 16
#: The narrowest block table of a graph, in blocks.
MIN_WIDTH = 8


def graph_sizes(most: int) -> list[int]:
    """The padded batch sizes of decoding graphs up to `most`: 1, 2, 4, then each power of
    two from 8 and 1.5 times it (8, 12, 16, 24, 32, 48, ..), and `most` itself: a step
    pads by at most 1.5x (2x below 8 rows, which cost little), for few graphs to record
    and keep."""
    sizes, power = [1, 2, 4], 8
    while sizes[-1] < most:
        sizes += [power, power * 3 // 2]
        power *= 2
    return [s for s in sizes if s < most] + [most]


class PagedSteps:
    """Runs steps (token ids, token table, block table: Model.forward_paged's arguments)
    over `cache`, whose block `scratch` no sequence holds; block tables are at most
    `width` blocks wide (a whole context's)."""

    def __init__(self, model: Model, cache: PagedCache, scratch: int, width: int,
                 max_batch: int):
        self.model, self.cache = model, cache
        self.scratch, self.width = scratch, width
        self.sizes = graph_sizes(max_batch)
        self._graphs: OrderedDict[tuple[int, int], tuple[Graph, Tensor, Tensor, Tensor]] = (
            OrderedDict())
        #: whether a greedy decoding step's graph leaves the next step's inputs (chain())
        self.chains = ops.decoding.advance_tokens.implementation(model.backend) != "missing"
        self._chained: Graph | None = None

    @property
    def recorded(self) -> list[tuple[int, int]]:
        """The (batch size, table width) of the decoding graphs kept, least recently used
        first."""
        return list(self._graphs)

    def run(self, token_ids: np.ndarray, token_table: np.ndarray, block_table: np.ndarray,
            last_rows: int, greedy: bool = False) -> np.ndarray:
        """The logits (last_rows, vocab) of the step's last `last_rows` tokens; with
        `greedy`, only their argmax (last_rows,) int32, which a decoding step takes on the
        device (a few integers read back instead of rows of a vocabulary's logits)."""
        self._chained = None
        if len(token_ids) == last_rows and len(token_ids) <= self.sizes[-1]:
            return self._decoding(token_ids, token_table, block_table,
                                  "greedy" if greedy else "logits")
        logits = self.model.forward_paged(self.cache, token_ids, token_table, block_table,
                                          last_rows)
        return ops.argmax.reference(logits, axis=-1) if greedy else logits

    def launch(self, token_ids: np.ndarray, token_table: np.ndarray,
               block_table: np.ndarray) -> Launch:
        """A greedy decoding step (every token its sequence's last), launched and not
        waited for: result()["greedy"][:n] are its tokens. Where `chains`, its graph then
        holds the next step's inputs, for chain()."""
        graph = self._write(token_ids, token_table, block_table)
        self._chained = graph if self.chains else None
        return graph.launch("greedy")

    def chain(self) -> Launch:
        """The step after the last launch()ed or chain()ed one, launched from the inputs
        that one left on the device: each sequence's token its argmax, one position
        further (their blocks must be in the block table launch() wrote)."""
        if self._chained is None:
            raise RuntimeError("chain() follows launch() on a backend with advance_tokens")
        return self._chained.launch("greedy")

    def _decoding(self, token_ids, token_table, block_table, output: str) -> np.ndarray:
        """A decoding step, waited for: its `output` of each of its tokens."""
        graph = self._write(token_ids, token_table, block_table)
        return graph.launch(output).result()[output][:len(token_ids)]

    def _write(self, token_ids, token_table, block_table) -> Graph:
        """The graph of the smallest size and width that hold a decoding step (token i:
        sequence i's), its inputs written; padding token i is sequence i, at position 0
        of the scratch block."""
        n = len(token_ids)
        size = next(s for s in self.sizes if s >= n)
        width = min(max(MIN_WIDTH, 1 << (block_table.shape[1] - 1).bit_length()), self.width)
        graph, ids, tokens, blocks = self._graph(size, width)
        padded_ids = np.zeros(size, np.int32)
        padded_ids[:n] = token_ids
        padded_tokens = np.stack([np.arange(size), np.zeros(size)], axis=1).astype(np.int32)
        padded_tokens[:n] = token_table
        padded_blocks = np.full((size, width), self.scratch, np.int32)
        padded_blocks[:n, :block_table.shape[1]] = block_table
        ids.write(padded_ids)
        tokens.write(padded_tokens)
        blocks.write(padded_blocks)
        return graph

    def _graph(self, size: int, width: int) -> tuple[Graph, Tensor, Tensor, Tensor]:
        """The decoding graph of `size` tokens and tables `width` blocks wide, recorded
        where it is not kept, with its input tensors."""
        key = (size, width)
        if key in self._graphs:
            self._graphs.move_to_end(key)
            return self._graphs[key]
        while len(self._graphs) >= GRAPHS_KEPT:
            self._graphs.popitem(last=False)
        backend = self.model.backend
        ids = backend.from_numpy(np.zeros(size, np.int32))
        tokens = backend.from_numpy(np.zeros((size, 2), np.int32))
        blocks = backend.from_numpy(np.full((size, width), self.scratch, np.int32))
        def record():
            logits = self.model.record_paged(self.cache, ids, tokens, blocks)
            greedy = ops.argmax(logits, axis=-1)
            if self.chains:  # after every read of the inputs
                ops.decoding.advance_tokens(ids, tokens, greedy)
            return {"logits": logits, "greedy": greedy}
        graph = Graph(backend, record)
        self._graphs[key] = (graph, ids, tokens, blocks)
        return self._graphs[key]
