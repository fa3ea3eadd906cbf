"""The seeds' entry points (pxvm.compat): GPUExecutor (numpy in/out, a method per op,
fallback with a reason) and is_gpu_available from pxvm.gpu.executor, GpuCommandBatch's
per-op methods, and pixel_llm's GPUDevice and DotProductGPU."""

import asyncio
import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pxvm
from pxvm.compat import GpuCommandBatch
from pxvm.gpu.executor import GPUExecutor, is_gpu_available
from pxvm.ops import REGISTRY
from pxvm.backends.webgpu import runtime as webgpu
from pxvm.core.errors import DeviceSelectionError, NoAdapterError


@pytest.fixture
def no_adapters(fresh_backends, monkeypatch):
    monkeypatch.setattr("pxvm.backends.webgpu.runtime.adapters.list_adapters", lambda: [])


def test_entry_points_import_from_the_seeds_paths():
    from pixel_llm.core import gpu_interface
    from pxvm.gpu import executor

    assert executor.GPUExecutor is pxvm.compat.GPUExecutor
    assert executor.is_gpu_available is pxvm.compat.is_gpu_available
    assert gpu_interface.DotProductGPU is pxvm.compat.DotProductGPU
    assert gpu_interface.GPUDevice is pxvm.compat.GPUDevice
    assert gpu_interface.is_gpu_available is pxvm.compat.is_gpu_available
    assert pxvm.GpuCommandBatch is GpuCommandBatch


def test_executor_has_a_sync_and_an_async_method_per_op():
    ex = GPUExecutor()   # on numpy where no GPU is usable: the same methods
    for name in REGISTRY:
        assert callable(getattr(ex, name)) and callable(getattr(ex, f"{name}_async"))
        assert name in dir(ex) and f"{name}_async" in dir(ex)
    assert callable(ex.swish) and callable(ex.swish_async)   # the seed's name for silu
    for missing in ("no_such_op", "no_such_op_async", "_private"):
        with pytest.raises(AttributeError):
            getattr(ex, missing)


def test_executor_runs_on_the_gpu_with_numpy_in_and_out(gpu_device, rng):
    ex = GPUExecutor()
    assert ex.on_gpu and is_gpu_available()
    assert ex.backend.name == "webgpu" and gpu_device.name in ex.device_name
    x = rng.standard_normal((7, 33)).astype(np.float32)
    out = ex.relu(x)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.where(x < 0, 0, x))
    a, b = rng.standard_normal((2, 5, 5)).astype(np.float32)
    np.testing.assert_allclose(asyncio.run(ex.matmul_async(a, b)), a @ b, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(ex.swish(x), ex.silu(x))


def test_executor_falls_back_to_the_cpu_without_an_adapter(no_adapters, caplog, rng):
    with caplog.at_level("WARNING"):
        ex = GPUExecutor()
    assert not ex.on_gpu and "no WebGPU adapter" in ex.fallback_reason
    assert ex.backend.name == "cpu"
    assert "running on the CPU" in caplog.text
    assert not is_gpu_available()
    x = rng.standard_normal(9).astype(np.float32)
    np.testing.assert_allclose(ex.sigmoid(x), 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_executor_falls_back_to_the_cpu_when_wgpu_cannot_be_imported():
    code = textwrap.dedent("""
        import sys
        sys.modules["wgpu"] = None  # makes `import wgpu` raise ImportError
        import numpy as np
        from pxvm.gpu.executor import GPUExecutor, is_gpu_available
        ex = GPUExecutor()
        print("on_gpu", ex.on_gpu, is_gpu_available())
        print("reason", ex.fallback_reason)
        print("result", ex.add(np.float32([1, 2]), np.float32([3, 4])).tolist())
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "on_gpu False False" in proc.stdout
    assert "wgpu could not be imported" in proc.stdout and "pip install wgpu" in proc.stdout
    assert "result [4.0, 6.0]" in proc.stdout
    assert "running on the CPU" in proc.stderr


def test_executor_refuses_to_fall_back_when_told_not_to(no_adapters):
    with pytest.raises(NoAdapterError):
        GPUExecutor(fallback=False)


def test_bad_pxvm_device_gives_a_clear_error(fresh_backends, monkeypatch):
    monkeypatch.setenv("PXVM_DEVICE", "no-such-gpu-anywhere")
    with pytest.raises(DeviceSelectionError, match="'no-such-gpu-anywhere' matches no adapter"):
        webgpu.get_device()
    assert not is_gpu_available("no-such-gpu-anywhere")


@pytest.mark.parametrize("backend", ["numpy", "webgpu"])
def test_command_batch_records_ops_by_method_into_one_submit(backend, rng, request, monkeypatch):
    submits = []
    if backend == "webgpu":
        device = request.getfixturevalue("gpu_device")
        submit = device.submit
        monkeypatch.setattr(device, "submit", lambda buf: submits.append(buf) or submit(buf))
    x = rng.standard_normal((3, 17)).astype(np.float32)
    batch = GpuCommandBatch(backend)
    t = batch.upload(x)
    y = batch.scale(batch.relu(t), 2.0)
    z = batch.add(y, t)
    assert not submits
    with pytest.raises(pxvm.BatchStateError, match="before execute"):
        batch.read(z)
    batch.execute()
    np.testing.assert_array_equal(batch.read(z), np.maximum(x, 0) * 2 + x)
    assert len(submits) == (1 if backend == "webgpu" else 0)
    with pytest.raises(AttributeError):
        batch.no_such_op


def test_gpu_device_and_dot_product_of_pixel_llm(gpu_device, rng, capsys):
    from pixel_llm.core.gpu_interface import DotProductGPU, GPUDevice

    device = GPUDevice()
    assert f"pxvm device: {device.description}" in capsys.readouterr().out
    assert gpu_device.name in device.description
    a, b = rng.standard_normal((2, 1000)).astype(np.float32)
    got = DotProductGPU(device).compute(a, b)
    assert isinstance(got, float)
    assert got == pytest.approx(float(np.dot(a.astype(np.float64), b)), rel=1e-4, abs=1e-3)
    assert DotProductGPU().compute([1, 2, 3], [4, 5, 6]) == 32.0


def test_gpu_device_describes_the_cpu_fallback(no_adapters):
    from pixel_llm.core.gpu_interface import GPUDevice

    device = GPUDevice(verbose=False)
    assert device.description.startswith("CPU fallback (no WebGPU adapter")


def test_executor_converts_the_seeds_float64_and_int64_arrays(gpu_device):
    # The seeds' API takes any numpy arrays; pxvm's own ops refuse float64 and int64.
    ex = GPUExecutor()
    a = np.linspace(-1, 1, 7)  # float64
    np.testing.assert_allclose(ex.mul(a, a), (a * a).astype(np.float32), rtol=1e-6)
    assert ex.add(np.arange(5), np.arange(5)).tolist() == [0, 2, 4, 6, 8]
    with pytest.raises(pxvm.ShapeError, match="do not fit in i32"):
        ex.add(np.array([2**40]), np.array([1]))
