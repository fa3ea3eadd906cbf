"""The WebGPU buffer pool (pxvm.backends.webgpu.runtime.memory): freed buffers are reused by size
class and usage, and a buffer whose wgpu wrapper was released meanwhile (the cycle
collector finalising a dropped model's allocations and buffers in one pass) is never
handed out again. Plain objects stand for wgpu buffers: no device needed."""

from __future__ import annotations

from pxvm.backends.webgpu.runtime.memory import BufferPool, size_class


class _Buffer:
    def __init__(self, size: int, usage: int):
        self.size, self.usage = size, usage
        self._internal = object()  # wgpu's native handle; None once released


def _pool():
    made = []

    def create(size, usage):
        made.append(_Buffer(size, usage))
        return made[-1]
    return BufferPool(create), made


def test_a_freed_buffer_is_reused_for_its_size_class_and_usage():
    pool, made = _pool()
    first = pool.take(1000, 8)
    pool.give_back(first)
    assert pool.take(size_class(1000), 8) is first
    assert pool.take(1000, 4) is not first and len(made) == 2  # another usage: a new one


def test_a_released_buffer_in_the_pool_is_skipped():
    pool, made = _pool()
    alive, dead = pool.take(1000, 8), pool.take(1000, 8)
    pool.give_back(alive)
    pool.give_back(dead)
    dead._internal = None  # its wrapper finalised after it was given back
    assert pool.take(1000, 8) is alive
    fresh = pool.take(1000, 8)
    assert fresh is not dead and len(made) == 3
    assert pool.kept_buffers == 0
