"""Kernel files as the runtime loads them: a file that extends another (a subgroup variant)
is the base's text then its own, its enable directives first, and a device compiles it only
where it has the features those directives name."""

from __future__ import annotations

from importlib import resources

import pytest

from pxvm.runtime.errors import ShaderCompileError
from pxvm.runtime.webgpu import device as device_module
from pxvm.runtime.webgpu.shaders import (EXTENDS, declared_bindings, enables, kernel_files,
                                         load_wgsl, struct_fields)


def _raw(name: str) -> str:
    return resources.files("pxvm.kernels").joinpath(name).read_text(encoding="utf-8")


EXTENDING = [name for name in kernel_files() if EXTENDS.match(_raw(name))]


def test_the_subgroup_products_extend_the_quantized_products():
    assert "matmul_quant_subgroups.wgsl" in EXTENDING


@pytest.mark.parametrize("name", EXTENDING)
def test_an_extending_file_loads_as_its_base_then_itself_directives_first(name):
    raw = _raw(name)
    base = EXTENDS.match(raw).group(1)
    text = load_wgsl(name)
    own = raw[EXTENDS.match(raw).end():].replace("enable subgroups;\n", "")
    assert "enable subgroups;" in raw   # browsers need it before any subgroup operation
    assert text.startswith("enable subgroups;\n")
    assert text.endswith(own) and _raw(base) in text
    assert text.index(_raw(base)) < text.index(own)
    # one layout and one Params for the base's and the variant's entry points
    assert declared_bindings(name) == declared_bindings(base)
    assert struct_fields(name) == struct_fields(base)


def test_enable_directives_name_their_extensions():
    assert enables("enable f16;\nenable subgroups, f16;\nfn f() {}\n") == ["f16", "subgroups",
                                                                           "f16"]
    assert enables("// enable f16; in a comment\nfn f() {}\n") == []


def test_a_device_without_a_kernels_feature_refuses_it_by_name(gpu_device, monkeypatch):
    monkeypatch.setattr(gpu_device, "features", gpu_device.features - {"subgroup"})
    gpu_device.forget_pipelines()   # a cached pipeline would be returned unchecked
    with pytest.raises(ShaderCompileError, match="needs subgroup, which .* does not offer"):
        gpu_device.pipeline("matmul_quant_subgroups.wgsl", "matmul_subgroup",
                            {"FORMAT": 8, "BLOCK_VALUES": 32, "BLOCK_BYTES": 34, "LANES": 4})


def test_naga_gets_the_subgroup_kernel_without_the_directive_it_rejects(gpu_device,
                                                                       monkeypatch):
    if not gpu_device.has("subgroup"):
        pytest.skip(f"{gpu_device.name} has no subgroups")
    compiled = []
    make = gpu_device.calls.create_shader_module
    monkeypatch.setattr(gpu_device.calls, "create_shader_module",
                        lambda device, label, code, checks=True: compiled.append(code) or
                        make(device, label, code, checks))
    gpu_device.forget_pipelines()
    gpu_device.pipeline("matmul_quant_subgroups.wgsl", "matmul_subgroup",
                        {"FORMAT": 8, "BLOCK_VALUES": 32, "BLOCK_BYTES": 34, "LANES": 4})
    [code] = compiled
    assert "enable subgroups;" not in code and "subgroupShuffleXor" in code
    assert device_module.UNPARSED_ENABLE.sub("", load_wgsl("matmul_quant_subgroups.wgsl")) == code
