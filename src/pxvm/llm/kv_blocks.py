"""The bookkeeping of a paged KV cache (model.PagedCache): which pool blocks are free,
how many sequences hold each, and a prefix cache of full blocks found by a hash of their
tokens chained with the previous block's (vLLM's automatic prefix caching), so a prompt
that starts as an earlier one did (a system prompt, a resumed sequence) reuses its keys
and values instead of computing them again.

A block is held (reference count > 0), cached (held by none but still holding the keys
of its hash, evicted least recently released first when no block is free) or free.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict, deque

import numpy as np

#: the hash chained into a sequence's first block
ROOT_HASH = b""


def block_hash(previous: bytes, tokens) -> bytes:
    """The prefix cache's key of a full block of `tokens` after the blocks whose hash is
    `previous`. A cryptographic hash: two prompts whose blocks collided would share keys
    and values, so users could not craft one that reads another's."""
    return hashlib.sha256(previous + np.asarray(tokens, np.int64).tobytes()).digest()


def prefix_hashes(tokens, block_size: int, blocks: int) -> list[bytes]:
    """The hashes of the first `blocks` full blocks of `tokens`."""
    hashes, previous = [], ROOT_HASH
    for j in range(blocks):
        previous = block_hash(previous, tokens[j * block_size:(j + 1) * block_size])
        hashes.append(previous)
    return hashes


class BlockManager:
    """The blocks of a pool of `blocks`: allocation, reference counts and the prefix cache.
    Not thread-safe: the engine calls it under its lock."""

    def __init__(self, blocks: int):
        self.total = blocks
        self.refs = [0] * blocks
        self.free: deque[int] = deque(range(blocks))
        self.hash_of: dict[int, bytes] = {}       # cached or held blocks with a hash
        self.block_of: dict[bytes, int] = {}
        #: blocks no sequence holds that keep their keys, least recently released first
        self.evictable: OrderedDict[int, None] = OrderedDict()

    def available(self) -> int:
        """Blocks that allocate() can hand out: free ones and cached ones no one holds."""
        return len(self.free) + len(self.evictable)

    def used(self) -> int:
        """Blocks held by at least one sequence."""
        return self.total - self.available()

    def cached_prefix(self, hashes: list[bytes]) -> list[int]:
        """The blocks holding the longest run of `hashes` from the first (not taken)."""
        found = []
        for h in hashes:
            block = self.block_of.get(h)
            if block is None:
                break
            found.append(block)
        return found

    def take(self, blocks: list[int]) -> None:
        """Hold cached blocks (cached_prefix's) for one more sequence."""
        for block in blocks:
            self.refs[block] += 1
            self.evictable.pop(block, None)

    def allocate(self, n: int) -> list[int]:
        """n blocks for one sequence: free ones first, then the least recently released
        cached ones, which leave the prefix cache. The caller checks available() first."""
        if n > self.available():
            raise RuntimeError(f"{n} KV blocks asked for, {self.available()} available")
        out = []
        for _ in range(n):
            if self.free:
                block = self.free.popleft()
            else:
                block, _ = self.evictable.popitem(last=False)
                del self.block_of[self.hash_of.pop(block)]
            self.refs[block] = 1
            out.append(block)
        return out

    def register(self, block: int, h: bytes) -> None:
        """A held block's keys are now those of full block `h`: later prompts may take it.
        Where another block already holds `h` (two sequences computed it together) that
        one stays the cached copy."""
        if h not in self.block_of and block not in self.hash_of:
            self.block_of[h] = block
            self.hash_of[block] = h

    def release(self, blocks: list[int]) -> None:
        """A sequence lets go of its blocks; those no one holds become cached (hashed ones)
        or free. Released last block first, so a sequence's tail is evicted before its
        prefix, which other prompts are likelier to share."""
        for block in reversed(blocks):
            self.refs[block] -= 1
            if self.refs[block] == 0:
                if block in self.hash_of:
                    self.evictable[block] = None
                else:
                    self.free.append(block)
