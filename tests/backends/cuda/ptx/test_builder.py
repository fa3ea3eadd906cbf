"""The PTX builder (pxvm.backends.cuda.ptx.builder): registers, result types, blocks, immediates
and module text, checked as text; test_ptxas.py assembles what the kernels emit."""

from __future__ import annotations

import struct

import pytest

from pxvm.backends.cuda.ptx.builder import Kernel, PtxError, f32, module


def _kernel():
    return Kernel("k", [("x", "u64"), ("n", "u32"), ("s", "f32")])


def test_registers_are_numbered_per_class_and_declared_once_each():
    k = _kernel()
    a, b = k.reg("f32"), k.reg("f32")
    c, d = k.reg("u32"), k.reg("s32")  # one b32 class for both
    p = k.reg("pred")
    assert (a.name, b.name, c.name, d.name, p.name) == ("%f1", "%f2", "%r1", "%r2", "%p1")
    text = k.text()
    assert ".reg .f32 %f<3>;" in text and ".reg .b32 %r<3>;" in text
    assert ".reg .pred %p<2>;" in text


@pytest.mark.parametrize("instr,type", [
    ("add.f32", "f32"), ("setp.lt.u32", "pred"), ("cvt.rn.f32.u32", "f32"),
    ("mul.wide.u32", "u64"), ("mad.lo.u32", "u32"), ("ld.global.v4.f32", "f32"),
    ("cvta.to.global.u64", "u64")])
def test_op_gives_the_instructions_result_type(instr, type):
    k = _kernel()
    assert k.op(instr, "%x").type == type


def test_op_without_a_typed_result_asks_for_emit():
    with pytest.raises(PtxError, match="emit"):
        _kernel().op("bar.sync", 0)


def test_params_are_loaded_and_pointers_made_global():
    k = _kernel()
    x, n, s = k.params()
    assert (x.type, n.type, s.type) == ("u64", "u32", "f32")
    body = "\n".join(k.lines)
    assert "ld.param.u64 %rd1, [x];" in body and "cvta.to.global.u64 %rd2, %rd1;" in body
    assert "ld.param.f32 %f1, [s];" in body


def test_if_branches_around_its_block_and_loops_count_up():
    k = _kernel()
    i = k.reg("u32")
    with k.if_(k.setp("lt.u32", i, 7)):
        k.emit("nop.marker")  # any text
    with k.loop(i, 10, 2):
        k.emit("inside")
    lines = [line.strip() for line in k.lines]
    assert lines[:4] == ["setp.lt.u32 %p1, %r1, 7;", "@!%p1 bra L1;", "nop.marker;", "L1:"]
    assert lines[4:] == ["L2:", "setp.ge.u32 %p2, %r1, 10;", "@%p2 bra L3;", "inside;",
                         "add.u32 %r1, %r1, 2;", "bra.uni L2;", "L3:"]


def test_an_unclosed_block_is_refused():
    k = _kernel()
    block = k.if_(k.setp("lt.u32", k.reg("u32"), 1))
    block.__enter__()
    with pytest.raises(PtxError, match="left open"):
        k.text()


@pytest.mark.parametrize("value", [0.0, -0.0, 1.0, 1.4426950408889634, -3.0e38, 1e-40,
                                   float("inf"), float("-inf")])
def test_f32_immediates_are_the_exact_bits(value):
    text = f32(value)
    assert text.startswith("0f") and len(text) == 10
    assert struct.unpack("<f", struct.pack("<I", int(text[2:], 16)))[0] == \
        struct.unpack("<f", struct.pack("<f", value))[0]


def test_module_names_version_target_and_refuses_unknown_archs():
    text = module([_kernel()], "sm_80")
    assert ".version 8.0" in text and ".target sm_80" in text and ".address_size 64" in text
    assert ".visible .entry k(" in text and ".param .u64 x," in text
    for bad in ("sm90", "compute_90", "sm_x"):
        with pytest.raises(PtxError, match="architecture"):
            module([_kernel()], bad)


def test_unknown_register_types_are_refused():
    with pytest.raises(PtxError, match="register type"):
        _kernel().reg("f8")


def test_sm_90_kernels_wait_for_their_predecessor_before_their_first_instruction():
    k = Kernel("copy", [("x", "u64")])
    (x,) = k.params()
    k.store("f32", x, f32(1.0))
    on_hopper = module([k], "sm_90").splitlines()
    body = [line.strip() for line in on_hopper if line.startswith("    ")
            and not line.strip().startswith((".reg", ".param"))]
    assert body[:2] == ["griddepcontrol.wait;", "griddepcontrol.launch_dependents;"]
    assert "griddepcontrol" not in module([k], "sm_80")  # Ampere has no dependent launch


def test_a_kernel_can_wait_for_its_predecessor_after_its_prefetches():
    k = Kernel("prefetching", [("w", "u64"), ("x", "u64")])
    w, x = k.params()
    k.emit(f"prefetch.global.L2 [{w}]")
    k.wait_for_predecessors()
    k.store("f32", x, f32(1.0))
    body = [line.strip() for line in module([k], "sm_90").splitlines()
            if line.startswith("    ") and not line.strip().startswith((".reg", ".param"))]
    prefetch, wait = body.index(f"prefetch.global.L2 [{w}];"), body.index("griddepcontrol.wait;")
    assert prefetch < wait == body.index("griddepcontrol.launch_dependents;") - 1
    assert wait < next(i for i, line in enumerate(body) if line.startswith("st.global"))
    assert body.count("griddepcontrol.wait;") == 1
    ampere = module([k], "sm_80")
    assert "griddepcontrol" not in ampere and "wait for predecessors" not in ampere


def test_waiting_twice_or_inside_a_block_is_refused():
    k = _kernel()
    x, n, _ = k.params()
    with pytest.raises(PtxError, match="inside a block"):
        with k.if_(k.setp("lt.u32", n, 4)):
            k.wait_for_predecessors()
    k = _kernel()
    k.wait_for_predecessors()
    with pytest.raises(PtxError, match="twice"):
        k.wait_for_predecessors()


def test_a_module_of_sm_90_and_sm_90a_kernels_targets_sm_90a_and_refuses_sm_80():
    plain, hopper, own = (Kernel(name, [], arch=arch) for name, arch in
                          (("plain", None), ("hopper", "sm_90"), ("own", "sm_90a")))
    assert ".target sm_90\n" in module([plain, hopper], "sm_90")
    assert ".target sm_90a\n" in module([plain, hopper, own], "sm_90")
    with pytest.raises(PtxError, match="hopper run on sm_90 only"):
        module([plain, hopper], "sm_80")


def test_a_register_cap_is_a_maxnreg_directive_between_parameters_and_body():
    capped = Kernel("capped", [("x", "u64")], max_registers=64)
    assert ")\n.maxnreg 64\n{" in module([capped], "sm_80")
    assert ".maxnreg" not in module([_kernel()], "sm_80")


def test_bulk_copies_count_on_a_barrier_that_threads_wait_on_in_a_loop():
    k = _kernel()
    bar = k.op("mov.u32", k.shared("landed", "b64", 1, 8))
    k.barrier_init(bar)
    k.barrier_expect(bar, 256)
    k.bulk_copy("%r9", "%rd9", 256, bar)
    k.barrier_wait(bar, 1)
    lines = [line.strip() for line in k.lines[1:]]
    assert lines[:4] == ["mbarrier.init.shared::cta.b64 [%r1], 1;",
                         "fence.mbarrier_init.release.cluster;",
                         "mbarrier.arrive.expect_tx.shared::cta.b64 _, [%r1], 256;",
                         "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes "
                         "[%r9], [%rd9], 256, [%r1];"]
    # a try_wait that fails (it may time out) tries again
    assert lines[4:] == ["L1:", "mbarrier.try_wait.parity.shared::cta.b64 %p1, [%r1], 1;",
                         "@!%p1 bra L1;"]


def test_a_tree_pairs_values_level_by_level_carrying_an_odd_one_up():
    k = Kernel("tree", [])
    a, b, c = (k.reg("f32") for _ in range(3))
    top = k.tree("max.f32", [a, b, c])
    first, second = [line.strip() for line in k.lines if "max.f32" in line]
    assert first.endswith(f"{a}, {b};")
    pair = first.split()[1].rstrip(",")
    assert second == f"max.f32 {top}, {pair}, {c};"
    assert k.tree("add.f32", [a]) is a
