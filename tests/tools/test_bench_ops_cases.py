"""pxvm.tools.bench_ops, the cases behind `pxvm bench ops` (tests/cli/test_bench_ops.py
runs the command): the quantized products' weights and shapes, each case's result
against its numpy reference, the copy case and the percentages of its rate."""

from __future__ import annotations

import numpy as np
import pytest

import pxvm
from pxvm.core import get_backend
from pxvm.ops.quant_types import dequantize
from pxvm.tools import bench_ops

QUANT_CASES = ["matmul_quant_q8_0", "matmul_quant_q4_k", "matmul_quant_q6_k"]
#: (values, bytes) of a block of each case's type, as GGML defines them
BLOCKS = {"matmul_quant_q8_0": (32, 34), "matmul_quant_q4_k": (256, 144),
          "matmul_quant_q6_k": (256, 210)}


def test_random_q6_k_blocks_dequantize_to_values_about_1_in_size(rng):
    w = bench_ops.quantized_weight(64, 1024, "Q6_K", rng)
    assert w.shape == (64, 1024 // 256 * 210) and w.dtype == np.uint8
    values = dequantize(w, "Q6_K", 1024)  # the gguf package's decoding
    assert values.shape == (64, 1024) and np.all(np.isfinite(values))
    assert 0.5 < np.sqrt(np.mean(values.astype(np.float64) ** 2)) < 2
    assert np.max(np.abs(values)) < 10
    assert np.std(values) > 0.5  # not one value repeated: the quants and scales vary


def test_quantized_products_default_to_llama_3_8b_shapes_and_sizes_mean_square():
    for name in QUANT_CASES:
        case = bench_ops.CASES[name]
        assert set(case.default) == {(4096, 4096), (14336, 4096), (4096, 14336)}
        assert case.from_size(1024) == (1024, 1024)
    assert bench_ops.CASES["matmul_quant_q6_k"].label((14336, 4096)).startswith(
        "Q6_K W 14336x4096, 1 row")


@pytest.mark.parametrize("backend_name", ["numpy", "cpu", "webgpu"])
@pytest.mark.parametrize("name", QUANT_CASES)
def test_quantized_products_check_out_against_numpy_at_a_quick_shape(name, backend_name, rng,
                                                                    request):
    if backend_name == "webgpu":
        request.getfixturevalue("gpu_device")
    case = bench_ops.CASES[name]
    shape, = case.quick
    row = bench_ops.run_case(case, shape, get_backend(backend_name), 1, rng)
    assert row.status == "ok", row.note
    assert row.pxvm_runs == ("reference" if backend_name == "numpy" else "kernel")
    assert 0 <= row.nmse <= case.nmse_limit and row.pxvm_seconds > 0
    n, k = shape  # the rate counts the weight's GGUF bytes
    values, nbytes = BLOCKS[name]
    assert row.work == n * k // values * nbytes


# ---- the copy: the run's bandwidth reference ----------------------------------------------

@pytest.mark.parametrize("backend_name", ["numpy", "cpu", "webgpu"])
def test_the_copy_case_copies_every_byte_of_its_input(backend_name, rng, request):
    if backend_name == "webgpu":
        request.getfixturevalue("gpu_device")
    case = bench_ops.CASES[bench_ops.COPY]
    shape, = case.quick
    (x,), params = case.make(shape, rng)
    assert case.work(shape) == 2 * x.nbytes  # each byte read once and written once
    backend = get_backend(backend_name)
    tx = backend.from_numpy(x)
    op = pxvm.ops.REGISTRY[case.op]
    _, _, got = bench_ops.time_pxvm(backend, lambda: op(tx, **params), 1)
    assert got.dtype == x.dtype and np.array_equal(got, x)  # bit for bit (new buffers: NaN)
    row = bench_ops.run_case(case, shape, backend, 1, rng)
    assert row.status == "ok" and row.nmse == 0.0 and row.pxvm_seconds > 0


def _one_ulp_high(ctx, x, start=0, stop=None):
    out = ctx.empty(x.shape, x.dtype)
    ctx.record_host("not quite a copy", lambda: out.storage.__setitem__(
        ..., np.nextafter(x.storage, np.float32(np.inf))))
    return out


def test_a_copy_off_by_one_ulp_fails_its_row(monkeypatch, rng):
    monkeypatch.setitem(pxvm.ops.slice_rows.kernels, "cpu", _one_ulp_high)
    case = bench_ops.CASES[bench_ops.COPY]
    row = bench_ops.run_case(case, case.quick[0], get_backend("cpu"), 1, rng)
    assert row.status == "FAIL" and 0 < row.nmse < 1e-12


def _row(case: str, unit: str, work: float, seconds: float | None, status: str = "ok"):
    return bench_ops.Row(case, "op", "shape", work, unit, status=status, pxvm_seconds=seconds)


def test_percentages_are_of_the_fastest_copy_that_checked_out_in_the_same_rows():
    copy_256, copy_1g = _row("copy", "B", 8e9, 1.0), _row("copy", "B", 16e9, 1.0)
    wrong_copy = _row("copy", "B", 32e9, 1.0, status="FAIL")  # fast, but not a copy
    product = _row("matmul_quant_q6_k", "B", 12e9, 1.0)
    failed = _row("matmul_quant_q4_k", "B", 12e9, 1.0, status="FAIL")
    skipped = _row("dot", "B", 1e9, None, status="skipped")
    flops = _row("matmul", "FLOP", 1e12, 1.0)
    rows = [copy_256, copy_1g, wrong_copy, product, failed, skipped, flops]
    assert bench_ops.add_percent_of_copy(rows) is copy_1g
    assert product.pxvm_percent_of_copy == pytest.approx(75.0)  # 12 GB/s of 16 GB/s
    assert copy_256.pxvm_percent_of_copy == pytest.approx(50.0)
    assert copy_1g.pxvm_percent_of_copy == pytest.approx(100.0)
    for r in (wrong_copy, failed, skipped, flops):
        assert r.pxvm_percent_of_copy is None
    assert product.as_dict()["pxvm_percent_of_copy"] == pytest.approx(75.0)


def test_without_a_copy_that_ran_there_are_no_percentages():
    product = _row("matmul_quant_q6_k", "B", 12e9, 1.0)
    rows = [_row("copy", "B", 8e9, None, status="skipped"), product]
    assert bench_ops.add_percent_of_copy(rows) is None
    assert product.pxvm_percent_of_copy is None


def test_a_case_in_bytes_brings_the_copy_first_at_its_own_shapes():
    copy = bench_ops.CASES[bench_ops.COPY]
    assert next(iter(bench_ops.CASES)) == bench_ops.COPY  # all cases: the copy first
    assert {4 * rows * row for rows, row in copy.default} == {256 << 20, 1 << 30}
    chosen = bench_ops.select(["matmul_quant_q6_k"])
    assert [(c.name, s) for c, s in bench_ops.plan(chosen, [1024])] == [
        ("copy", copy.default[0]), ("copy", copy.default[1]),
        ("matmul_quant_q6_k", (1024, 1024))]
    assert [(c.name, s) for c, s in bench_ops.plan(chosen, quick=True)] == [
        ("copy", copy.quick[0]), ("matmul_quant_q6_k", (512, 512))]
    # named, the copy takes --sizes as its rows; FLOP-rated cases run without it
    assert [(c.name, s) for c, s in bench_ops.plan(bench_ops.select(["dot", "copy"]), [64])] \
        == [("copy", (64, bench_ops.ROW)), ("dot", (64,))]
    assert [c.name for c, _ in bench_ops.plan(bench_ops.select(["matmul"]))] == ["matmul"] * 4


# ---- a weight is read from memory, not from the cache the run before filled ----------

def test_each_run_of_a_quantized_product_reads_another_copy_of_the_weight(monkeypatch, rng):
    matmul_quant = pxvm.ops.matmul_quant
    real_kernel = matmul_quant.kernels["cpu"]
    weights_read = []

    def spy(ctx, x, w, **params):
        weights_read.append(id(w.storage))
        return real_kernel(ctx, x, w, **params)

    monkeypatch.setitem(matmul_quant.kernels, "cpu", spy)
    case = bench_ops.CASES["matmul_quant_q4_k"]
    row = bench_ops.run_case(case, case.quick[0], get_backend("cpu"), 4, rng)
    assert row.status == "ok", row.note
    assert len(weights_read) == 5 and len(set(weights_read)) == 5  # warm-up and 4 timed


def test_copies_of_the_inputs_stop_at_cold_bytes_and_hold_the_same_values(rng):
    backend = get_backend("numpy")
    small = [rng.standard_normal(1024).astype(np.float32)]  # 4 KiB
    assert len(bench_ops.input_copies(backend, small, cold=False, runs=11)) == 1
    copies = bench_ops.input_copies(backend, small, cold=True, runs=11)
    assert len(copies) == 11  # fewer runs than COLD_BYTES of copies: one a run
    assert len({id(c[0].storage) for c in copies}) == 11
    assert all(np.array_equal(c[0].numpy(), small[0]) for c in copies)
    big = [np.zeros(bench_ops.COLD_BYTES // 4 // 3 + 1, np.float32)]  # a third of COLD_BYTES
    assert len(bench_ops.input_copies(backend, big, cold=True, runs=11)) == 3


def test_copies_are_cut_to_what_the_device_holds_in_a_tensor():
    chosen = bench_ops.select(["matmul_quant_q4_k"])
    copies = [s for c, s in bench_ops.plan(chosen, max_tensor_bytes=128 << 20) if c.name == "copy"]
    assert copies == [(8192, bench_ops.ROW)]  # 256 MiB and 1 GiB, both cut to 128 MiB
    copies = [s for c, s in bench_ops.plan(chosen, max_tensor_bytes=512 << 20) if c.name == "copy"]
    assert copies == [(16384, bench_ops.ROW), (32768, bench_ops.ROW)]
    # sizes asked for are run as asked (and skipped where they do not fit)
    named = bench_ops.plan(bench_ops.select(["copy"]), [1 << 16], max_tensor_bytes=128 << 20)
    assert [s for _, s in named] == [(1 << 16, bench_ops.ROW)]


def test_a_row_where_pxvm_ran_numpys_reference_claims_no_speedup():
    own = bench_ops.Row("rmsnorm", "rmsnorm", "shape", 1.0, "B", pxvm_seconds=1.0,
                        pxvm_runs="kernel")
    reference = bench_ops.Row("rmsnorm", "rmsnorm", "shape", 1.0, "B", pxvm_seconds=1.0,
                              pxvm_runs="reference")
    assert own.speedup(2.0) == 2.0
    assert reference.speedup(2.0) is None and reference.as_dict()["pxvm_vs_numpy"] is None

