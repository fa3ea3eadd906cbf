"""The seeds' entry points: GPUExecutor (numpy in/out, fallback with a reason) and
pixel_llm's DotProductGPU."""

import subprocess
import sys
import textwrap

import numpy as np
import pytest

import pxvm.runtime as runtime
from pxvm.gpu.executor import GPUExecutor, is_gpu_available
from pxvm.ops import REGISTRY


@pytest.fixture
def fresh_device():
    """Forget the shared device for the test, and restore it afterwards."""
    saved = runtime._device
    runtime._device = None
    yield
    runtime._device = saved


def test_executor_has_a_sync_and_an_async_method_per_op():
    for name in REGISTRY:
        assert callable(getattr(GPUExecutor, name)) and callable(getattr(GPUExecutor, f"{name}_async"))


def test_executor_runs_on_the_gpu_with_numpy_in_and_out(gpu_device, rng):
    ex = GPUExecutor()
    assert ex.on_gpu and is_gpu_available()
    x = rng.standard_normal((7, 33)).astype(np.float32)
    out = ex.relu(x)
    assert isinstance(out, np.ndarray)
    np.testing.assert_array_equal(out, np.where(x < 0, 0, x))


def test_executor_falls_back_to_numpy_without_an_adapter(fresh_device, monkeypatch, caplog, rng):
    monkeypatch.setattr("pxvm.runtime.adapters.list_adapters", lambda: [])
    with caplog.at_level("WARNING"):
        ex = GPUExecutor()
    assert not ex.on_gpu and "no WebGPU adapter" in ex.fallback_reason
    assert "running on numpy" in caplog.text
    assert not is_gpu_available()
    x = rng.standard_normal(9).astype(np.float32)
    np.testing.assert_allclose(ex.sigmoid(x), 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_executor_falls_back_to_numpy_when_wgpu_cannot_be_imported():
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
    assert "running on numpy" in proc.stderr


def test_executor_refuses_to_fall_back_when_told_not_to(fresh_device, monkeypatch):
    monkeypatch.setattr("pxvm.runtime.adapters.list_adapters", lambda: [])
    with pytest.raises(runtime.NoAdapterError):
        GPUExecutor(fallback=False)


def test_bad_pxvm_device_gives_a_clear_error(fresh_device, monkeypatch):
    monkeypatch.setenv("PXVM_DEVICE", "no-such-gpu-anywhere")
    with pytest.raises(runtime.DeviceSelectionError, match="'no-such-gpu-anywhere' matches no adapter"):
        runtime.get_device()
