"""Dispatch plans (pxvm/web/plans.py): a plan replayed on the runtime's device with nothing
but its own data (buffers, kernel files, entry points, constants, uniform bytes, workgroup
counts) reproduces the numpy reference, and for pxVM programs the CPU executor's bytes.
The conformance table itself (cases.py) is tested in test_cases.py."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from conftest import nmse
from pxvm.core import DTYPES
from pxvm.backends.webgpu.ops.elementwise import ElementwiseParams
from pxvm.backends.webgpu.runtime import workgroup_grid
from pxvm.web import cases, plans


def replay_natively(device, plan) -> np.ndarray:
    """Run a plan through pxvm.backends.webgpu.runtime directly, the way the page does in JavaScript."""
    allocs = []
    for b in plan["buffers"]:
        if b["data"] is None:
            alloc = device.alloc(max(b["nbytes"], 4), "plan output")
            alloc.nbytes = b["nbytes"]
        else:
            alloc = device.upload(np.frombuffer(base64.b64decode(b["data"]), np.uint8))
        allocs.append(alloc)
    rec = device.recorder()
    for d in plan["dispatches"]:
        pipe = device.pipeline(d["kernel"], d["entry"], d["constants"])
        params = None if d["params"] is None else base64.b64decode(d["params"])
        rec.dispatch(pipe, [allocs[i] for i in d["bindings"]], params, tuple(d["groups"]))
    result = plan["result"]
    staged = rec.stage(allocs[result["buffer"]])
    rec.submit()
    dtype = DTYPES[result["dtype"]]
    count = int(np.prod(result["shape"], dtype=np.int64))
    return staged.result(dtype, count).reshape(result["shape"])


def expected_of(plan) -> np.ndarray:
    exp = plan["expected"]
    return np.frombuffer(base64.b64decode(exp["data"]), DTYPES[exp["dtype"]]).reshape(exp["shape"])


@pytest.mark.parametrize("case_id", plans.case_ids())
def test_replayed_plan_matches_numpy_reference(gpu_device, case_id):
    plan = plans.conformance_plan(case_id, seed=3)
    got = replay_natively(gpu_device, plan)
    expected = expected_of(plan)
    if plan["exact"]:
        np.testing.assert_array_equal(got, expected)
    else:
        assert nmse(got, expected) <= plan["threshold"]


def test_plan_records_uniform_bytes_and_spreads_large_grids():
    ctx = plans.plan_context()
    x = ctx.tensor(np.arange(5, dtype=np.float32))
    out = ctx.empty((5,), np.float32)
    shape = (1, 2, 3, 4, 5, 6, 7, 8)
    params = ElementwiseParams(5, 3, -2.0, 0.5, shape, (0,) * 8, (9,) * 8)
    ctx.dispatch("elementwise.wgsl", "unary", [x, x, out], params, 70000, {"OP": 3})
    d = ctx.device.plan(out)["dispatches"][0]
    # the struct's bytes, spelled out: u32 n, u32 ndim, f32 alpha, f32 beta, 3 x u32[8]
    assert base64.b64decode(d["params"]) == (
        np.array([5, 3], "<u4").tobytes() + np.array([-2.0, 0.5], "<f4").tobytes()
        + np.array(shape + (0,) * 8 + (9,) * 8, "<u4").tobytes())
    assert tuple(d["groups"]) == workgroup_grid(70000, 65535) and d["groups"][0] <= 65535
    assert d["bindings"] == [0, 0, 1] and d["constants"] == {"OP": 3.0}
    assert ctx.device.plan(out)["buffers"][1]["data"] is None  # outputs are poisoned by the page


def test_plan_context_is_the_webgpu_backends_recording_context():
    """The ops' kernels record into the same context class on a GPU and into a plan."""
    from pxvm.backends.webgpu import WebGPUContext

    ctx = plans.plan_context(("shader-f16",))
    assert isinstance(ctx, WebGPUContext) and isinstance(ctx.device, plans.PlanDevice)
    assert ctx.has("shader-f16") and not plans.plan_context().has("shader-f16")
    assert ctx.backend.name == "webgpu" and not ctx.is_software
    with pytest.raises(RuntimeError, match="replayed by the browser"):
        ctx.device.recorder()


def test_plan_refuses_tensors_from_elsewhere():
    a, b = plans.plan_context(), plans.plan_context()
    x = a.tensor(np.ones(3, np.float32))
    with pytest.raises(ValueError, match="not recorded in this plan"):
        b.dispatch("elementwise.wgsl", "unary", [x], None, 1)
    with pytest.raises(ValueError, match="not recorded in this plan"):
        b.device.plan(x)


@pytest.mark.parametrize("source", ["dot_test.pxi", "random-1", "random-2"])
def test_replayed_program_plan_is_byte_identical_to_cpu_executor(gpu_device, source):
    vm = pytest.importorskip("pxvm.vm")
    if source.startswith("random"):
        img = cases.random_program(int(source.split("-")[1]))
    else:
        from importlib import resources

        img = vm.load_pxi(resources.files("pxvm.examples").joinpath(source).read_bytes())
    plan = plans.program_plan(img)
    got = replay_natively(gpu_device, plan).view(np.uint8).reshape(img.shape)
    cpu = vm.run_program_cpu(img.copy())
    assert np.array_equal(expected_of(plan), cpu)
    assert np.array_equal(got, cpu)
    assert not np.array_equal(cpu, img), "the program should change the image"
