"""Choosing a backend by name (get_backend), the Backend interface every backend
implements, recording contexts (none on numpy), and copying tensors between backends."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

import pxvm
from pxvm.backends.cpu import CpuBackend, CpuContext
from pxvm.backends.numpy import NumpyBackend
from pxvm.backends.webgpu import WebGPUBackend, WebGPUContext
from pxvm.backends.webgpu import runtime as webgpu
from pxvm.core import (Backend, RecordingContext, Tensor, get_backend, selection,
                       unavailable_reason)
from pxvm.backends.webgpu.runtime import CapturingRecorder, ProfilingRecorder, Recorder


# ---- names -------------------------------------------------------------------------

def test_names_and_aliases():
    assert selection.names() == ("auto", "numpy", "cpu", "webgpu", "wgpu", "gpu", "cuda")
    assert selection.aliases() == {"numpy": "numpy", "cpu": "cpu", "webgpu": "webgpu",
                                   "wgpu": "webgpu", "gpu": "webgpu", "cuda": "cuda"}


@pytest.mark.parametrize("name", ["numpy", "NumPy"])
def test_numpy_names_give_the_one_numpy_backend(name):
    backend = get_backend(name)
    assert isinstance(backend, NumpyBackend) and backend.name == "numpy"
    assert backend is get_backend("numpy")
    assert unavailable_reason(name) is None


@pytest.mark.parametrize("name", ["cpu", "CPU"])
def test_cpu_names_give_the_one_fast_cpu_backend(name):
    backend = get_backend(name)
    assert isinstance(backend, CpuBackend) and backend.name == "cpu"
    assert backend is get_backend("cpu") and backend is not get_backend("numpy")
    assert unavailable_reason(name) is None


@pytest.mark.parametrize("name", ["webgpu", "wgpu", "gpu", "WebGPU"])
def test_webgpu_names_give_the_backend_on_the_shared_device(name, gpu_device):
    backend = get_backend(name)
    assert isinstance(backend, WebGPUBackend) and backend.name == "webgpu"
    assert backend.device is gpu_device and backend is get_backend("webgpu")
    assert unavailable_reason(name) is None


def test_auto_is_webgpu_where_a_gpu_is_usable(gpu_device):
    assert get_backend("auto") is get_backend("webgpu")
    assert get_backend() is get_backend("webgpu")


def test_auto_falls_back_to_the_fast_cpu_backend_saying_why_once(fresh_backends, monkeypatch,
                                                                  caplog):
    monkeypatch.setattr("pxvm.backends.webgpu.runtime.adapters.list_adapters", lambda: [])
    with caplog.at_level("WARNING", logger="pxvm.backends"):
        assert get_backend("auto") is get_backend("cpu")
        assert get_backend("auto") is get_backend("cpu")
    warnings = [r.getMessage() for r in caplog.records]
    assert len(warnings) == 1
    assert "no usable GPU, running on the CPU" in warnings[0]
    assert "no WebGPU adapter" in warnings[0]
    assert "no WebGPU adapter found" in unavailable_reason("gpu")
    with pytest.raises(pxvm.PxvmError, match="no WebGPU adapter found"):
        get_backend("webgpu")   # asked for by name: no fallback


def test_a_backend_object_is_its_own_backend():
    mine = NumpyBackend()
    assert get_backend(mine) is mine and get_backend(mine) is not get_backend("numpy")
    assert pxvm.tensor([1.0], backend=mine).backend is mine


def test_unknown_backend_name_lists_the_names():
    with pytest.raises(ValueError, match=r"unknown backend 'metal'; use one of "
                                         r"auto, numpy, cpu, webgpu, wgpu, gpu, cuda"):
        get_backend("metal")
    with pytest.raises(ValueError, match="unknown backend"):
        pxvm.tensor([1.0], backend="tpu")


def test_cuda_is_named_but_says_why_where_there_is_no_driver():
    reason = unavailable_reason("cuda")
    if reason is None:
        pytest.skip("this machine has CUDA")
    assert "driver" in reason or "cuda-bindings" in reason or "device" in reason
    with pytest.raises(pxvm.PxvmError, match="CUDA|driver|cuda-bindings"):
        get_backend("cuda")
    assert get_backend("auto").name != "cuda"


def test_a_model_on_auto_runs_where_ops_do_without_cuda(monkeypatch):
    monkeypatch.setattr(selection, "unavailable_reason",
                        lambda name: "no driver" if name == "cuda" else None)
    backend, reason = selection.model_backend("auto")
    assert backend is selection.get_backend("auto") and reason is None


def test_reset_backends_makes_a_new_device_on_next_use(fresh_backends, gpu_device):
    first = get_backend("webgpu")
    assert first.device is not gpu_device   # made afresh: the shared one was forgotten
    selection.reset_backends()
    second = get_backend("webgpu")
    assert second is not first and second.device is not first.device
    assert second.device is webgpu.get_device()


# ---- the interface -----------------------------------------------------------------

def test_numpy_backend_has_no_recording_context():
    backend = get_backend("numpy")
    assert backend.context() is None
    assert backend.context(timestamps=True, profile=True, capture=True) is None
    assert backend.describe().startswith(f"numpy {np.__version__}")
    assert not backend.compiles_on_first_use


def test_webgpu_backend_context_records_on_its_device(gpu_device):
    backend = get_backend("webgpu")
    ctx = backend.context()
    assert isinstance(ctx, WebGPUContext) and isinstance(ctx, RecordingContext)
    assert ctx.backend is backend and ctx.device is gpu_device
    assert type(ctx.recorder) is Recorder and not ctx.one_buffer
    capturing = backend.context(capture=True)
    assert isinstance(capturing.recorder, CapturingRecorder) and capturing.one_buffer
    if gpu_device.has("timestamp-query"):
        assert isinstance(backend.context(profile=True).recorder, ProfilingRecorder)
    assert backend.context(timestamps=True).one_buffer
    assert backend.compiles_on_first_use
    assert backend.describe().startswith(f"WebGPU on {gpu_device.name}")


def test_backend_is_an_abc_that_refuses_incomplete_subclasses():
    with pytest.raises(TypeError, match="abstract"):
        Backend()

    class Incomplete(Backend):
        name = "incomplete"

        def describe(self):
            return "half a backend"

    with pytest.raises(TypeError, match="abstract") as info:
        Incomplete()
    assert all(name in str(info.value) for name in ("from_numpy", "to_numpy", "write"))
    assert Incomplete.__abstractmethods__ == {"from_numpy", "to_numpy", "write"}


def test_a_complete_backend_gets_the_default_context_and_async_read():
    class Listy(Backend):
        name = "listy"

        def describe(self):
            return "lists"

        def from_numpy(self, array):
            arr = np.asarray(array, np.float32)
            return Tensor(arr.shape, arr.dtype, self, arr.tolist())

        def to_numpy(self, tensor):
            return np.array(tensor.storage, np.float32)

        def write(self, tensor, array):
            tensor.storage = np.asarray(array, np.float32).tolist()

    backend = Listy()
    assert backend.context() is None
    t = pxvm.tensor([1.0, 2.0], backend=backend)
    assert t.storage == [1.0, 2.0]
    np.testing.assert_array_equal(asyncio.run(t.numpy_async()), [1.0, 2.0])
    assert asyncio.run(backend.wait_async()) is None


def test_recording_context_is_an_abc_that_refuses_incomplete_subclasses():
    class Incomplete(RecordingContext):
        def stage(self, tensor):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Incomplete()
    assert Incomplete.__abstractmethods__ == {"submit", "flush", "capture"}


# ---- copying between backends ------------------------------------------------------

@pytest.mark.parametrize("src,dst", [("numpy", "webgpu"), ("webgpu", "numpy"),
                                     ("webgpu", "webgpu"), ("numpy", "numpy")])
def test_pxvm_tensor_copies_a_tensor_to_a_backend(src, dst, rng, gpu_device):
    values = rng.standard_normal((3, 7)).astype(np.float32)
    original = pxvm.tensor(values, backend=src)
    copy = pxvm.tensor(original, backend=dst)
    assert copy.backend is get_backend(dst)
    assert copy.shape == (3, 7) and copy.dtype == np.float32
    assert copy.storage is not original.storage
    np.testing.assert_array_equal(copy.numpy(), values)
    copy.write(np.zeros(21, np.float32))   # a copy: the original keeps its values
    np.testing.assert_array_equal(original.numpy(), values)


@pytest.mark.parametrize("dtype", [np.int32, np.uint32, np.uint8])
def test_copies_between_backends_keep_integer_dtypes(dtype, rng, gpu_device):
    values = rng.integers(0, 200, 13).astype(dtype)
    on_gpu = pxvm.tensor(values, backend="webgpu")
    back = pxvm.tensor(on_gpu, backend="numpy")
    assert on_gpu.dtype == back.dtype == np.dtype(dtype)
    np.testing.assert_array_equal(back.storage, values)
