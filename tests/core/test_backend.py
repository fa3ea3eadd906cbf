"""What a backend says of its device's memory (Backend.memory_bytes): the host's for the
backends whose tensors are host arrays, nothing for WebGPU, which reports none; and the
tensors of zeros it makes (Backend.zeros), zero even where a freed buffer is reused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from pxvm.core import DeviceMemory, get_backend
from pxvm.core.backend import host_memory

MEMINFO = """MemTotal:       16318480 kB
MemFree:          512000 kB
MemAvailable:    9000000 kB
Buffers:          100000 kB
"""


def test_host_memory_is_what_meminfo_says_is_available(tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(MEMINFO)
    assert host_memory(str(path)) == DeviceMemory(9000000 * 1024, 16318480 * 1024)


@pytest.mark.parametrize("text", ["", "MemTotal: 100 kB\n", "MemTotal: lots\nMemAvailable: 1 kB\n"])
def test_host_memory_is_unknown_where_meminfo_does_not_say(text, tmp_path):
    path = tmp_path / "meminfo"
    path.write_text(text)
    assert host_memory(str(path)) is None
    assert host_memory(str(tmp_path / "missing")) is None


@pytest.mark.parametrize("name", ["numpy", "cpu"])
def test_host_backends_report_the_hosts_memory(name):
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo on this system")
    memory = get_backend(name).memory_bytes()
    physical = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    assert memory.total == pytest.approx(physical, rel=0.01)
    assert 0 < memory.free <= memory.total


def test_webgpu_cannot_tell_its_memory(gpu_device):
    assert get_backend("webgpu").memory_bytes() is None


@pytest.mark.parametrize("name", ["numpy", "cpu", "webgpu"])
@pytest.mark.parametrize("dtype", [np.float32, np.float16])
def test_zeros_are_zeros_even_in_a_reused_buffer(name, dtype, request):
    if name == "webgpu":
        request.getfixturevalue("gpu_device")  # skips where there is none
    backend = get_backend(name)
    shape = (37, 3, 8)
    for _ in range(3):  # a freed tensor of this size (its buffer pooled on a GPU) first
        backend.from_numpy(np.full(shape, 7, dtype))
    zeros = backend.zeros(shape, dtype)
    assert (zeros.shape, zeros.dtype) == (shape, np.dtype(dtype))
    values = backend.to_numpy(zeros)
    assert values.dtype == dtype and values.shape == shape and not values.any()
