"""The conformance matrix: every op x every backend this machine has x the op's shared
cases (pxvm.ops.cases: odd shapes, fresh random inputs, outputs poisoned by the test
session), each result against the op's numpy reference within the case's NMSE.

A cell runs (Op.implementation) the backend's own kernel, the op's decomposition into
other ops (fused ops on backends without the fused kernel), or the reference on the
backend's host arrays (numpy; the CPU backend's ops without a SIMD kernel). A kernel a
backend lacks, for every case or for some, is an expected gap: GAPS lists them, and each
cell in it must still raise MissingKernelError, so the table can only shrink (a kernel
added fails its GAPS entry until the entry goes). The matrix is printed at the end of
the run (conftest.py's terminal summary). The backends are those pxvm.backends
registers: a new one joins the matrix by registering.

Fused ops are also run as their decomposition on every backend and checked against the
same reference and against the fused result.
"""

from __future__ import annotations

import numpy as np
import pytest
from conftest import nmse

from pxvm.core import get_backend, unavailable_reason
from pxvm.core.selection import registered
from pxvm.ops import REGISTRY, MissingKernelError
from pxvm.ops.cases import CASES

BACKENDS = registered()
#: the fixtures that pick (or skip) the GPU backends' devices as the rest of the suite does
DEVICE_FIXTURES = {"webgpu": "gpu_device", "cuda": "cuda_device"}

ALL = None
#: (op, backend) -> the cases (indices into the op's CASES, ALL: every one) a backend has
#: no kernel for yet; each must raise MissingKernelError.
GAPS: dict[tuple[str, str], tuple[int, ...] | None] = {
    ("conv2d", "cuda"): ALL,
    ("convolve2d", "cuda"): ALL,
    ("gelu", "cuda"): ALL,
    # CUDA's binary kernels: float32, one operand repeated over the other's leading axes
    **{(op, "cuda"): (0, 1, 2) for op in ("add", "sub", "mul", "maximum", "minimum")},
    ("div", "cuda"): (0,),
    # CUDA's tensor-core kernels: B as (N, K); heads of 64 or 128
    ("matmul_f16", "cuda"): (0,),
    ("attention_f16", "cuda"): (0, 1),
}


def is_gap(name: str, index: int, backend: str) -> bool:
    cases = GAPS.get((name, backend), ())
    return cases is ALL or index in cases

#: (op, backend) -> how the cell runs, filled as the matrix runs (conftest prints it)
MATRIX: dict[tuple[str, str], str] = {}


def _cells():
    for name in sorted(REGISTRY):
        for index, _ in enumerate(CASES.get(name, ())):
            for backend in BACKENDS:
                yield pytest.param(name, index, backend, id=f"{name}-{index}-{backend}")


def _backend(name: str, request):
    """The backend, or a skip saying why this machine has none."""
    if name in DEVICE_FIXTURES:
        request.getfixturevalue(DEVICE_FIXTURES[name])
    elif (reason := unavailable_reason(name)) is not None:
        pytest.skip(f"no {name} backend here: {reason}")
    return get_backend(name)


def _inputs(name: str, index: int, rng) -> tuple[list[np.ndarray], dict]:
    case = CASES[name][index]
    return [np.asarray(x) for x in case.make(rng)], case.params


def _expected(op, inputs, params) -> np.ndarray:
    """The reference on copies of the inputs (in-place ops write into theirs)."""
    copies = [x.copy() for x in inputs]
    with np.errstate(all="ignore"):
        out = np.asarray(op.reference(*copies, **params))
    meta = op.infer(copies, params)
    return out.astype(meta.dtype).reshape(meta.shape)


def _check(got: np.ndarray, expected: np.ndarray, threshold: float, what: str) -> None:
    assert got.shape == expected.shape and got.dtype == expected.dtype, what
    if threshold == 0.0 or expected.dtype.kind in "iu":
        np.testing.assert_array_equal(got, expected, err_msg=what)
    else:
        assert nmse(got, expected) <= threshold, f"{what}: NMSE {nmse(got, expected):.3e}"


@pytest.mark.parametrize("name,index,backend_name", list(_cells()))
def test_every_op_on_every_backend_matches_its_reference(name, index, backend_name, rng,
                                                          request):
    backend = _backend(backend_name, request)
    op = REGISTRY[name]
    inputs, params = _inputs(name, index, rng)
    expected = _expected(op, inputs, params)
    how = MATRIX[(name, backend_name)] = op.implementation(backend)
    tensors = [backend.from_numpy(x) for x in inputs]
    if is_gap(name, index, backend_name):
        with pytest.raises(MissingKernelError, match=name):
            op(*tensors, **params)
        return
    assert how != "missing", f"{name} has no {backend_name} kernel: add one (or a GAPS entry)"
    got = op(*tensors, **params).numpy()
    _check(got, expected, CASES[name][index].threshold, f"{name} on {backend_name} ({how})")


def _decomposed_cells():
    for name in sorted(REGISTRY):
        if REGISTRY[name].decomposition is None:
            continue
        for index, _ in enumerate(CASES.get(name, ())):
            for backend in BACKENDS:
                yield pytest.param(name, index, backend, id=f"{name}-{index}-{backend}")


@pytest.mark.parametrize("name,index,backend_name", list(_decomposed_cells()))
def test_every_fused_op_equals_its_decomposition(name, index, backend_name, rng, request):
    backend = _backend(backend_name, request)
    op = REGISTRY[name]
    inputs, params = _inputs(name, index, rng)
    if is_gap(name, index, backend_name):  # neither runs there
        for run in (op, op.decomposition):
            with pytest.raises(MissingKernelError):
                run(*[backend.from_numpy(x) for x in inputs], **params)
        return
    expected = _expected(op, inputs, params)
    threshold = CASES[name][index].threshold
    fused = op(*[backend.from_numpy(x) for x in inputs], **params).numpy()
    decomposed = op.decomposition(*[backend.from_numpy(x) for x in inputs], **params)
    assert decomposed.backend is backend  # the primitives ran where the inputs are
    decomposed = decomposed.numpy()
    _check(decomposed, expected, threshold, f"{name} decomposed on {backend_name}")
    _check(fused, expected, threshold, f"{name} on {backend_name}")
    _check(decomposed, fused, threshold, f"{name} fused against decomposed on {backend_name}")


def test_every_op_has_conformance_cases():
    assert sorted(n for n in REGISTRY if n not in CASES) == [], (
        "add cases for these ops to pxvm/ops/cases.py")
    assert set(CASES) <= set(REGISTRY), "a case for an op that is not registered"


def test_every_gap_names_a_registered_op_and_backend():
    assert {op for op, _ in GAPS} <= set(REGISTRY)
    assert {backend for _, backend in GAPS} <= set(BACKENDS)


def test_a_backend_without_an_ops_kernel_runs_its_decomposition(rng, monkeypatch):
    # a fused op whose kernel a backend lacks runs as the ops it decomposes into there
    op = REGISTRY["rmsnorm_glu_quant"]
    monkeypatch.delitem(op.kernels, "cpu")
    backend = get_backend("cpu")
    assert op.implementation(backend) == "decomposed"
    inputs, params = _inputs("rmsnorm_glu_quant", 0, rng)
    got = op(*[backend.from_numpy(x) for x in inputs], **params).numpy()
    _check(got, _expected(op, inputs, params), CASES["rmsnorm_glu_quant"][0].threshold,
           "rmsnorm_glu_quant decomposed on cpu")
