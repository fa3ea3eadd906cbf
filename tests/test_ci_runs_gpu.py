"""The suite must exercise the real GPU path: in CI a missing adapter is a failure."""

import os

import pytest

from conftest import TEST_ADAPTER


def test_a_webgpu_adapter_is_present_when_running_in_ci():
    if not os.environ.get("CI"):
        pytest.skip("only enforced when CI is set")
    assert TEST_ADAPTER is not None, (
        "CI found no WebGPU adapter: install mesa-vulkan-drivers (lavapipe) so the WGSL "
        "kernels are really tested"
    )
