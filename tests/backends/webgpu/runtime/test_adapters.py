"""Adapter choice: discrete over integrated over anything else, software only on request."""

import pytest

from pxvm.core.errors import DeviceSelectionError, NoAdapterError
from pxvm.backends.webgpu.runtime.adapters import AdapterDescription, choose_adapter


def fake(index, name, kind, backend="Vulkan"):
    return AdapterDescription(index, name, "", backend, kind, [], {})


LAVAPIPE = fake(0, "llvmpipe (LLVM 15.0.6, 256 bits)", "CPU")
IGPU = fake(1, "Intel(R) Graphics", "IntegratedGPU")
DGPU = fake(2, "NVIDIA H100 80GB HBM3", "DiscreteGPU")
DGPU_GL = fake(3, "NVIDIA H100 80GB HBM3", "DiscreteGPU", backend="OpenGL")


def test_auto_prefers_discrete_over_integrated_over_software():
    chosen, reason = choose_adapter("auto", [LAVAPIPE, IGPU, DGPU])
    assert chosen is DGPU and "DiscreteGPU" in reason
    chosen, _ = choose_adapter("auto", [LAVAPIPE, IGPU])
    assert chosen is IGPU


def test_auto_prefers_vulkan_over_opengl_for_the_same_gpu():
    chosen, _ = choose_adapter("auto", [DGPU_GL, DGPU])
    assert chosen is DGPU


def test_auto_never_picks_a_software_adapter():
    with pytest.raises(NoAdapterError, match="only software adapters.*PXVM_DEVICE"):
        choose_adapter("auto", [LAVAPIPE, fake(1, "SwiftShader Device", "Unknown")])


def test_software_adapter_is_used_when_asked_by_name_or_index():
    assert choose_adapter("llvmpipe", [LAVAPIPE, DGPU])[0] is LAVAPIPE
    assert choose_adapter("0", [LAVAPIPE, DGPU])[0] is LAVAPIPE
    assert choose_adapter(0, [LAVAPIPE, DGPU])[0] is LAVAPIPE


def test_bad_device_request_names_the_request_and_lists_adapters():
    with pytest.raises(DeviceSelectionError, match=r"'radeon' matches no adapter.*llvmpipe"):
        choose_adapter("radeon", [LAVAPIPE, DGPU])
    with pytest.raises(DeviceSelectionError, match=r"only 2 adapters"):
        choose_adapter("7", [LAVAPIPE, DGPU])


def test_environment_variable_is_the_default_request(monkeypatch):
    monkeypatch.setenv("PXVM_DEVICE", "intel")
    assert choose_adapter(None, [LAVAPIPE, IGPU, DGPU])[0] is IGPU


def test_no_adapter_at_all_says_how_to_get_one():
    with pytest.raises(NoAdapterError, match="mesa-vulkan-drivers"):
        choose_adapter("auto", [])
