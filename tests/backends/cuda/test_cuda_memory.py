"""The CUDA backend's device memory: what it reports free and in all (the driver's
cuMemGetInfo, the pool's buffers counted free), running out of it as
OutOfDeviceMemoryError, and tensors of zeros set on the device. Skipped, saying why,
without a driver."""

from __future__ import annotations

import gc

import numpy as np
import pytest

from pxvm.core.errors import OutOfDeviceMemoryError

GIB = 1 << 30


def test_memory_is_the_devices_and_an_allocation_takes_its_share(cuda_device):
    device = cuda_device.device
    before = cuda_device.memory_bytes()
    assert before.total == device.info.memory_bytes
    assert 0 < before.free <= before.total
    held = device.alloc(GIB)
    during = cuda_device.memory_bytes()
    # the driver allocates in pages: at most 2 MiB more than asked, and nothing else runs
    assert before.free - GIB - (64 << 20) <= during.free <= before.free - GIB + (2 << 20)
    del held
    gc.collect()
    after = cuda_device.memory_bytes()  # the buffer went back to the pool: free again
    assert after.free >= during.free + GIB - (2 << 20)


def test_running_out_of_device_memory_is_a_clear_error(cuda_device):
    total = cuda_device.memory_bytes().total
    with pytest.raises(OutOfDeviceMemoryError) as info:
        cuda_device.device.alloc(total + GIB)
    assert f"{total + GIB:,} bytes" in str(info.value) and "\n" not in str(info.value)


def test_zeros_are_set_on_the_device_even_in_a_pooled_buffer(cuda_device):
    shape = (300, 4, 64)
    for _ in range(3):  # freed buffers of this size go back to the pool, then are reused
        cuda_device.from_numpy(np.full(shape, np.nan, np.float16))
    zeros = cuda_device.zeros(shape, np.float16)
    assert (zeros.shape, zeros.dtype) == (shape, np.dtype(np.float16))
    assert not cuda_device.to_numpy(zeros).any()
