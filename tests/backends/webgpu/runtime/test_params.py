"""Typed kernel parameters (pxvm.backends.webgpu.runtime.params): every class pxvm defines matches
the uniform struct of each of its kernel files and packs to exactly that struct's bytes;
a class that does not match its kernel is refused, naming both member lists."""

from __future__ import annotations

import re
import struct

import numpy as np
import pytest

import pxvm.backends.webgpu  # noqa: F401 - defines the ops' parameter classes
import pxvm.vm  # noqa: F401 - defines the pxVM interpreter's
from pxvm.backends.webgpu import webgpu_backend
from pxvm.backends.webgpu.ops.elementwise import ElementwiseParams
from pxvm.backends.webgpu.runtime import UNIFORM_SLOT, kernel_files, load_wgsl, shaders
from pxvm.backends.webgpu.runtime.params import KernelParams, f32, i32, kernel_params, u32, u32x8
from pxvm.backends.webgpu.runtime.shaders import struct_fields
from pxvm.vm.gpu import InstructionParams


def _subclasses(cls) -> list[type]:
    found = []
    for sub in cls.__subclasses__():
        found += [sub, *_subclasses(sub)]
    return found


#: Every parameter class pxvm itself defines (not throwaway ones of tests).
CLASSES = sorted({c for c in _subclasses(KernelParams) if c.__module__.startswith("pxvm.")},
                 key=lambda c: f"{c.__module__}.{c.__qualname__}")
PAIRS = [(cls, kernel) for cls in CLASSES for kernel in cls.KERNELS]
#: How the test itself packs each WGSL member type (independently of the classes').
FORMATS = {"u32": "I", "i32": "i", "f32": "f", "array<vec4<u32>,2>": "8I"}
_UNIFORM_PARAMS = re.compile(r"var\s*<\s*uniform\s*>\s*\w+\s*:\s*Params\s*;")


def _pair_id(pair) -> str:
    cls, kernel = pair
    return f"{cls.__name__}-{kernel}"


def test_pxvm_defines_parameter_classes_for_its_kernels():
    names = {c.__name__ for c in CLASSES}
    assert {"ElementwiseParams", "NormParams", "MatmulParams", "MatmulQuantParams",
            "CachedAttentionParams", "InstructionParams"} <= names


@pytest.mark.parametrize("pair", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_every_parameter_class_matches_each_of_its_kernel_files(pair):
    cls, kernel = pair
    cls.check(kernel)   # raises TypeError on any difference
    assert struct_fields(kernel, cls.STRUCT) == tuple((n, t.wgsl) for n, t in cls.MEMBERS)


def test_every_kernel_with_a_uniform_params_struct_is_covered_by_a_class():
    declaring = [k for k in kernel_files() if _UNIFORM_PARAMS.search(load_wgsl(k))]
    assert len(declaring) >= 10
    covered = {kernel for cls, kernel in PAIRS if cls.STRUCT == "Params"}
    assert [k for k in declaring if k not in covered] == []


def _sample_values(wgsl_types, seed: int) -> list:
    """Distinct, exactly representable values for members of these WGSL types."""
    rng = np.random.default_rng(seed)
    values = []
    for t in wgsl_types:
        if t == "u32":
            values.append(int(rng.integers(0, 2**32)))
        elif t == "i32":
            values.append(-int(rng.integers(1, 2**31)))
        elif t == "f32":
            values.append(float(rng.integers(-1000, 1000)) / 8)
        else:
            values.append(tuple(int(v) for v in rng.integers(0, 2**32, 8)))
    return values


@pytest.mark.parametrize("pair", PAIRS, ids=[_pair_id(p) for p in PAIRS])
def test_pack_gives_the_structs_bytes_in_the_kernels_member_order(pair):
    cls, kernel = pair
    declared = struct_fields(kernel, cls.STRUCT)
    values = _sample_values([t for _, t in declared], seed=len(declared))
    params = cls(**{name: v for (name, _), v in zip(declared, values)})
    flat = [x for v in values for x in (v if isinstance(v, tuple) else (v,))]
    expected = struct.pack("<" + "".join(FORMATS[t] for _, t in declared), *flat)
    assert params.pack() == expected
    assert len(expected) <= UNIFORM_SLOT


def test_elementwise_params_pack_their_u32x8_arrays_as_two_vec4():
    shape, a_st, b_st = tuple(range(1, 9)), tuple(range(10, 18)), (0,) * 7 + (1,)
    params = ElementwiseParams(n=40320, ndim=8, alpha=0.5, beta=-2.0, shape=shape,
                               a_strides=a_st, b_strides=b_st)
    packed = params.pack()
    assert packed == struct.pack("<IIff8I8I8I", 40320, 8, 0.5, -2.0, *shape, *a_st, *b_st)
    assert len(packed) == 16 + 3 * 32
    assert np.frombuffer(packed[16:48], "<u4").tolist() == list(shape)


def test_instruction_params_pack_a_negative_zero_point_as_i32():
    params = InstructionParams(width=64, r0=1, r1=2, r2=3, m=4, k=5, n=6, mult=2**31 + 7,
                               shift=9, zp=-128)
    packed = params.pack()
    assert packed == struct.pack("<9Ii", 64, 1, 2, 3, 4, 5, 6, 2**31 + 7, 9, -128)
    assert packed[-4:] == b"\x80\xff\xff\xff"


# ---- classes that do not match their kernel ----------------------------------------

NORM = "{rows: u32, row_len: u32, eps: f32}"


def test_a_renamed_member_is_refused_naming_both_member_lists():
    @kernel_params("norm.wgsl")
    class Renamed(KernelParams):
        rows: u32
        length: u32
        eps: f32

    with pytest.raises(TypeError) as info:
        Renamed.check("norm.wgsl")
    assert str(info.value) == (
        f"Renamed does not match struct Params of norm.wgsl: the kernel declares {NORM}, "
        "the class {rows: u32, length: u32, eps: f32}")


@pytest.mark.parametrize("members", [
    {"rows": u32, "row_len": i32, "eps": f32},            # retyped
    {"rows": u32, "row_len": u32, "eps": u32},            # retyped
    {"row_len": u32, "rows": u32, "eps": f32},            # reordered
    {"rows": u32, "row_len": u32},                        # one missing
    {"rows": u32, "row_len": u32, "eps": f32, "n": u32},  # one too many
], ids=["u32-as-i32", "f32-as-u32", "reordered", "missing", "extra"])
def test_a_retyped_reordered_missing_or_extra_member_is_refused(members):
    cls = kernel_params("norm.wgsl")(type("Wrong", (KernelParams,), {"__annotations__": members}))
    spelled = "{" + ", ".join(f"{n}: {t.__metadata__[0].wgsl}" for n, t in members.items()) + "}"
    expected = f"the kernel declares {NORM}, the class {spelled}"
    with pytest.raises(TypeError, match=re.escape(expected)):
        cls.check("norm.wgsl")


def test_a_matching_throwaway_class_passes_and_packs():
    @kernel_params("norm.wgsl")
    class Norm(KernelParams):
        rows: u32
        row_len: u32
        eps: f32

    Norm.check("norm.wgsl")
    assert Norm(3, 64, 0.25).pack() == struct.pack("<IIf", 3, 64, 0.25)
    assert Norm.KERNELS == ("norm.wgsl",) and Norm.STRUCT == "Params"


def test_a_misaligned_array_member_is_refused_at_definition():
    with pytest.raises(TypeError, match=r"Bad\.shape \(array<vec4<u32>,2>\) would sit at byte "
                                        r"4, not a multiple of its alignment 16"):
        @kernel_params("elementwise.wgsl")
        class Bad(KernelParams):
            n: u32
            shape: u32x8


def test_check_on_a_kernel_not_among_the_classes_files_is_refused():
    norm_params = next(c for c in CLASSES if c.KERNELS == ("norm.wgsl",))
    with pytest.raises(TypeError, match=f"{norm_params.__name__} describes the parameters of "
                                        "norm.wgsl, not softmax.wgsl"):
        norm_params.check("softmax.wgsl")
    with pytest.raises(TypeError, match="not norm.wgsl"):
        InstructionParams.check("norm.wgsl")


def test_a_mismatched_class_is_refused_before_its_first_dispatch(gpu_device):
    @kernel_params("norm.wgsl")
    class Swapped(KernelParams):
        row_len: u32
        rows: u32
        eps: f32

    backend = webgpu_backend()
    ctx = backend.context()
    x = ctx.tensor(np.ones((2, 4), np.float32))
    with pytest.raises(TypeError, match="Swapped does not match struct Params of norm.wgsl"):
        ctx.dispatch("norm.wgsl", "rmsnorm", [x, x, x, ctx.empty((2, 4), np.float32)],
                     Swapped(4, 2, 1e-5), 2)
    assert ctx.dispatches == 0


# ---- parsing the struct out of WGSL text -------------------------------------------

FAKE_WGSL = """
struct Other { a: f32, }

// the parameters
struct Params {
    n: u32,            // elements
    scale : f32,
    count: u32, bias: f32,
    shape: array< vec4<u32>,  2 >,   // padded
    zp: i32
}

@group(0) @binding(0) var<uniform> p: Params;
"""


@pytest.fixture
def fake_kernel(monkeypatch):
    """load_wgsl gives FAKE_WGSL for "fake_for_test.wgsl" (struct_fields' cache emptied
    around the test)."""
    real = shaders.load_wgsl
    monkeypatch.setattr(shaders, "load_wgsl",
                        lambda name: FAKE_WGSL if name == "fake_for_test.wgsl" else real(name))
    struct_fields.cache_clear()
    yield "fake_for_test.wgsl"
    struct_fields.cache_clear()


def test_struct_fields_reads_members_in_order_without_comments_or_spaces(fake_kernel):
    assert struct_fields(fake_kernel) == (
        ("n", "u32"), ("scale", "f32"), ("count", "u32"), ("bias", "f32"),
        ("shape", "array<vec4<u32>,2>"), ("zp", "i32"))
    assert struct_fields(fake_kernel, "Other") == (("a", "f32"),)
    with pytest.raises(KeyError, match="fake_for_test.wgsl declares no struct Missing"):
        struct_fields(fake_kernel, "Missing")


def test_a_class_checks_against_a_parsed_struct_of_any_name(fake_kernel):
    @kernel_params(fake_kernel)
    class Fake(KernelParams):
        n: u32
        scale: f32
        count: u32
        bias: f32
        shape: u32x8
        zp: i32

    @kernel_params(fake_kernel, struct_name="Other")
    class OtherParams(KernelParams):
        a: f32

    @kernel_params(fake_kernel)   # struct Params, but with Other's members
    class Misnamed(KernelParams):
        a: f32

    Fake.check(fake_kernel)
    OtherParams.check(fake_kernel)
    assert Fake(1, 0.5, 2, -1.0, tuple(range(8)), -3).pack() == \
        struct.pack("<IfIf8Ii", 1, 0.5, 2, -1.0, *range(8), -3)
    with pytest.raises(TypeError, match=re.escape(
            "the kernel declares {n: u32, scale: f32, count: u32, bias: f32, "
            "shape: array<vec4<u32>,2>, zp: i32}, the class {a: f32}")):
        Misnamed.check(fake_kernel)
