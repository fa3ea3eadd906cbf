"""The paged KV cache's bookkeeping (pxvm.llm.kv_blocks): blocks handed out once, shared
blocks freed only when the last holder lets go, cached blocks found by their chained
hashes and evicted least recently released first (a sequence's tail before its prefix)."""

from __future__ import annotations

import pytest

from pxvm.llm.kv_blocks import BlockManager, prefix_hashes


def test_blocks_are_handed_out_once_and_come_back_when_released():
    blocks = BlockManager(4)
    a, b = blocks.allocate(3), blocks.allocate(1)
    assert sorted(a + b) == [0, 1, 2, 3] and blocks.available() == 0 and blocks.used() == 4
    with pytest.raises(RuntimeError, match="1 KV blocks asked for, 0 available"):
        blocks.allocate(1)
    blocks.release(a)
    assert blocks.available() == 3 and sorted(blocks.allocate(3)) == sorted(a)


def test_a_block_hash_depends_on_every_earlier_block():
    first = prefix_hashes([1, 2, 3, 4, 5, 6], 3, 2)
    other_start = prefix_hashes([9, 2, 3, 4, 5, 6], 3, 2)
    assert len(first) == 2 and first[0] != other_start[0]
    assert first[1] != other_start[1]  # the same tokens after another prefix
    assert prefix_hashes([1, 2, 3, 4, 5, 6, 7], 3, 2) == first


def test_cached_blocks_are_shared_and_freed_only_by_their_last_holder():
    blocks = BlockManager(6)
    hashes = prefix_hashes(list(range(8)), 4, 2)
    held = blocks.allocate(2)
    for block, h in zip(held, hashes):
        blocks.register(block, h)
    assert blocks.cached_prefix(hashes) == held
    blocks.take(held)                              # a second sequence
    blocks.release(held)
    assert blocks.used() == 2                      # still held by the second
    blocks.release(held)
    assert blocks.used() == 0 and blocks.available() == 6
    assert blocks.cached_prefix(hashes) == held    # cached though no one holds them
    blocks.take(held)
    assert blocks.used() == 2 and blocks.available() == 4


def test_eviction_takes_free_blocks_first_then_the_least_recently_released_tail_first():
    blocks = BlockManager(4)
    old, new = prefix_hashes([1] * 8, 4, 2), prefix_hashes([2] * 8, 4, 2)
    first, second = blocks.allocate(2), blocks.allocate(2)
    for held, hashes in ((first, old), (second, new)):
        for block, h in zip(held, hashes):
            blocks.register(block, h)
    blocks.release(first)
    blocks.release(second)
    # first's tail, then its prefix, then second's tail
    assert blocks.allocate(1) == [first[1]]
    assert blocks.cached_prefix(old) == [first[0]]
    assert blocks.allocate(2) == [first[0], second[1]]
    assert blocks.cached_prefix(old) == [] and blocks.cached_prefix(new) == [second[0]]


def test_a_hash_already_cached_keeps_its_first_block():
    blocks = BlockManager(2)
    (h,) = prefix_hashes([5] * 4, 4, 1)
    a, b = blocks.allocate(1) + blocks.allocate(1)
    blocks.register(a, h)
    blocks.register(b, h)  # computed alongside: not cached a second time
    blocks.release([b])
    assert blocks.cached_prefix([h]) == [a] and len(blocks.free) == 1
