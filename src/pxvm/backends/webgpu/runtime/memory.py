"""Device memory: buffers lent from a pool by size class and given back when the
`Allocation` holding them is collected, so loops of small ops do not grow memory."""

from __future__ import annotations

import threading
from collections import defaultdict

#: Freed buffers kept for reuse, at most.
POOL_KEEP_BYTES = 1 << 30


def size_class(nbytes: int) -> int:
    """A request rounded up so that similar sizes share pooled buffers (<= 25% waste)."""
    n = max(256, (int(nbytes) + 3) // 4 * 4)
    step = max(256, 1 << max(0, n.bit_length() - 3))
    return (n + step - 1) // step * step


def binding_bytes(nbytes: int) -> int:
    """The bytes a binding of a tensor of `nbytes` covers: whole 16-byte units (at least
    one), so that vec4 views of it reach every value."""
    return max(16, (int(nbytes) + 15) // 16 * 16)


class Allocation:
    """A device buffer lent from the pool; given back when this object is collected.
    `nbytes` is what the tensor uses (the buffer may be larger: its size class)."""

    __slots__ = ("buffer", "nbytes", "_pool", "__weakref__")

    def __init__(self, buffer, nbytes: int, pool: "BufferPool"):
        self.buffer = buffer
        self.nbytes = nbytes
        self._pool = pool

    def binding_size(self) -> int:
        """The bytes a shader binding of this allocation covers: whole 16-byte units, so
        that a kernel viewing it as vec4s reaches its last values (the buffer's size
        class is a multiple of 256 bytes: there is room)."""
        return binding_bytes(self.nbytes)

    def __del__(self):
        pool = self._pool
        if pool is not None:
            self._pool = None
            pool.give_back(self.buffer)


class BufferPool:
    """Freed buffers by (size class, usage), reused before new ones are created."""

    def __init__(self, create):
        self._create = create  # (size, usage) -> a new wgpu buffer
        self._free: dict[tuple[int, int], list] = defaultdict(list)
        self._kept = 0
        # kept here: module globals are gone when the last buffers are given back at exit
        self._keep_bytes = POOL_KEEP_BYTES
        self._lock = threading.Lock()
        self.created = 0

    @property
    def kept_buffers(self) -> int:
        """Freed buffers waiting for reuse."""
        with self._lock:
            return sum(len(bucket) for bucket in self._free.values())

    def take(self, nbytes: int, usage: int):
        cls = size_class(nbytes)
        with self._lock:
            bucket = self._free.get((cls, usage))
            while bucket:
                self._kept -= cls
                buffer = bucket.pop()
                # a buffer given back by an Allocation that the cycle collector took in
                # the same pass as the buffer's own wrapper (a dropped model: it and its
                # decoder refer to each other) was released by wgpu: not reusable
                if getattr(buffer, "_internal", True) is not None:
                    return buffer
        self.created += 1
        return self._create(cls, usage)

    def give_back(self, buffer) -> None:
        key = (int(buffer.size), int(buffer.usage))
        with self._lock:
            if self._kept + key[0] <= self._keep_bytes:
                self._free[key].append(buffer)
                self._kept += key[0]
                return
        try:
            buffer.destroy()
        except Exception:  # the device may already be gone at interpreter exit
            pass

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._kept = 0
