"""Kernel files as the runtime loads them: a file that extends another (a subgroup variant,
the one-lane products) replaces the base's functions of the same names, its enable
directives first, and a device compiles it only where it has the features those
directives name."""

from __future__ import annotations

from importlib import resources

import re

import pytest

from pxvm.core.errors import ShaderCompileError
from pxvm.backends.webgpu.runtime import device as device_module
from pxvm.backends.webgpu.runtime.shaders import (EXTENDS, FUNCTION, KERNELS, declared_bindings, enables,
                                         function_span, kernel_files, load_wgsl, struct_fields)


def _raw(name: str) -> str:
    return resources.files(KERNELS).joinpath(name).read_text(encoding="utf-8")


EXTENDING = [name for name in kernel_files() if EXTENDS.match(_raw(name))]


def test_the_subgroup_products_extend_the_quantized_products():
    assert "matmul_quant_subgroups.wgsl" in EXTENDING


@pytest.mark.parametrize("name", EXTENDING)
def test_an_extending_file_replaces_its_bases_functions_of_the_same_name(name):
    raw = _raw(name)
    base = EXTENDS.match(raw).group(1)
    text = load_wgsl(name)
    own = raw[EXTENDS.match(raw).end():].replace("enable subgroups;\n", "")
    if name.endswith("_subgroups.wgsl"):
        assert "enable subgroups;" in raw   # browsers need it before any subgroup operation
        assert text.startswith("enable subgroups;\n")
    assert text.endswith(own)
    replaced = set(FUNCTION.findall(own)) & set(FUNCTION.findall(_raw(base)))
    assert replaced   # a variant that replaces nothing is a mistake
    # each function once (the variant's), every other function of the base kept
    assert sorted(FUNCTION.findall(text)) == sorted(
        set(FUNCTION.findall(_raw(base))) | set(FUNCTION.findall(own)))
    # the base's entry points (and any of the variant's own), layout and Params serve it
    assert text.count("@compute") == _raw(base).count("@compute") + own.count("@compute")
    assert declared_bindings(name) == declared_bindings(base)
    assert struct_fields(name) == struct_fields(base)


WORKGROUP_VARIABLE = re.compile(r"^var<workgroup> (\w+)", re.MULTILINE)


def _function_bodies(source: str) -> dict[str, str]:
    """Each function's text, from `fn name(` to the brace closing its body (comments
    dropped first)."""
    code = re.sub(r"//.*", "", source)
    return {name: code[slice(*function_span(code, name))] for name in FUNCTION.findall(code)}


def _reached_workgroup_variables(source: str, entry: str) -> set[str]:
    """The workgroup variables that `entry` and the functions it calls, directly or not,
    name: what a browser's WebGPU zeroes as each of its workgroups starts."""
    bodies = _function_bodies(source)
    reached, todo = set(), [entry]
    while todo:
        name = todo.pop()
        if name not in reached:
            reached.add(name)
            todo += [f for f in re.findall(r"\b(\w+)\(", bodies[name]) if f in bodies]
    variables = set(WORKGROUP_VARIABLE.findall(source))
    return {v for name in reached for v in variables
            if re.search(rf"(?<![\w.]){v}\b", bodies[name])}  # not a struct member


def test_the_one_lane_products_reach_no_workgroup_memory():
    # (the base's `matmul` reaches its column sums' and the attention merge's arrays)
    assert _reached_workgroup_variables(load_wgsl("matmul_quant.wgsl"), "matmul") >= {
        "partial", "merged"}
    assert _reached_workgroup_variables(load_wgsl("matmul_quant_columns.wgsl"),
                                        "matmul_columns") == set()


def test_replacing_a_function_keeps_what_follows_it_and_skips_braces_in_comments():
    from pxvm.backends.webgpu.runtime.shaders import _without_function

    text = ("fn a() -> u32 {\n    // } not the end {\n    if (true) { return 1u; }\n"
            "    return 2u;\n}\nfn b() {}\n")
    assert _without_function(text, "a") == "fn b() {}\n"
    assert _without_function(text, "c") == text


def test_enable_directives_name_their_extensions():
    assert enables("enable f16;\nenable subgroups, f16;\nfn f() {}\n") == ["f16", "subgroups",
                                                                           "f16"]
    assert enables("// enable f16; in a comment\nfn f() {}\n") == []


def test_a_device_without_a_kernels_feature_refuses_it_by_name(gpu_device, monkeypatch):
    monkeypatch.setattr(gpu_device, "features", gpu_device.features - {"subgroup"})
    gpu_device.forget_pipelines()   # a cached pipeline would be returned unchecked
    with pytest.raises(ShaderCompileError, match="needs subgroup, which .* does not offer"):
        gpu_device.pipeline("matmul_quant_subgroups.wgsl", "matmul",
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
    gpu_device.pipeline("matmul_quant_subgroups.wgsl", "matmul",
                        {"FORMAT": 8, "BLOCK_VALUES": 32, "BLOCK_BYTES": 34, "LANES": 4})
    [code] = compiled
    assert "enable subgroups;" not in code and "subgroupShuffleXor" in code
    assert device_module.UNPARSED_ENABLE.sub("", load_wgsl("matmul_quant_subgroups.wgsl")) == code
