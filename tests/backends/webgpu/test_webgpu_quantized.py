"""matmul_quant.wgsl (pxvm.backends.webgpu.ops.quantized): the row kernel in every lane
count with and without subgroups, the tiled kernel of prompts in every tile shape and
from its row threshold, and embedding lookups, against the references, next to the CPU
backend's."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import NMSE_LONG, nmse, record_dispatches

import pxvm
from pxvm.backends.webgpu.ops import quantized
from pxvm.backends.webgpu.ops import subgroups as webgpu_subgroups
from pxvm.core import tuning
from pxvm.ops.quant_types import quant_type
from pxvm.web.plans import record_op

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "llm"))
from gguf_blocks import FORMATS, dequantize, quantize, random_blocks  # noqa: E402

TYPES = sorted(FORMATS)
K_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]  # 256-value super-blocks, no quantizer: random valid blocks


def _weight(qtype, n, k, rng):
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng)
    return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 7])
def test_matmul_quant_backends(qtype, m, rng, gpu_device, subgroups, dispatched):
    n, k = 33, (512 if qtype in K_TYPES else 96)
    w = _weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    expected = x.astype(np.float64) @ dequantize(w, qtype, k).astype(np.float64).T
    # lanes: threads per output column (None: chosen by shape and device, 1 on CPU
    # drivers; the others forced, so every width runs whatever the driver: narrower and
    # wider than a subgroup)
    for backend, lanes in (("cpu", None), ("gpu", None), ("gpu", 1), ("gpu", 4), ("gpu", 32),
                           ("gpu", 64)):
        dispatched.clear()
        with tuning.forcing(quantized.LANES_TUNED, lanes):
            got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, backend=backend).numpy()
        assert got.shape == (m, n)
        assert nmse(got, expected) <= NMSE_LONG / 50, (backend, lanes)
        if lanes and lanes > 1:
            assert [kernel for kernel, _ in dispatched] == [
                quantized.SUBGROUP_KERNEL if subgroups else quantized.KERNEL]


@pytest.mark.parametrize("features,lanes,variants,kernel,entry", [
    (("subgroup",), 4, True, "matmul_quant_subgroups.wgsl", "matmul"),
    (("subgroup",), 1, True, "matmul_quant_columns.wgsl", "matmul_columns"),  # nothing to sum
    (("subgroup",), 4, False, "matmul_quant.wgsl", "matmul"),
    ((), 4, True, "matmul_quant.wgsl", "matmul"),                # a device without subgroups
])
def test_row_products_sum_by_subgroups_where_granted(features, lanes, variants, kernel, entry,
                                                     rng):
    x = rng.standard_normal((1, 64)).astype(np.float32)
    w = _weight("Q8_0", 16, 64, rng)
    with tuning.forcing(webgpu_subgroups.TUNED, variants), \
            tuning.forcing(quantized.LANES_TUNED, lanes):
        [dispatch] = record_op(pxvm.ops.matmul_quant, [x, w], {"qtype": "Q8_0", "k": 64},
                               features)["dispatches"]
    assert (dispatch["kernel"], dispatch["entry"]) == (kernel, entry)


# K at the boundaries of real models' rows: SmolLM2's 576 (Q8_0 only: K-quants need whole
# super-blocks), an odd multiple of 256, Llama 3.2 1B's 2048, 8B's 4096 and its FFN's
# 14,336 (more tasks than a workgroup's threads).
MATVEC_KS = (576, 768, 2048, 4096, 14336)


@pytest.mark.parametrize("qtype", quantized.MATVEC_TYPES)
@pytest.mark.parametrize("k", MATVEC_KS)
def test_matvec_matches_float64_at_model_row_lengths(qtype, k, rng, gpu_device, subgroups,
                                                     product_entries):
    # Decoding's products (`matvec`, forced in a few shapes: on lavapipe it is not
    # chosen by itself) for one and for three rows of x; N = 19 is not a whole number of
    # any shape's rows.
    if k % quant_type(qtype).block_values:
        pytest.skip(f"{qtype} rows are whole super-blocks")
    n = 19
    w = _weight(qtype, n, k, rng)
    for m in (1, 3):
        x = rng.standard_normal((m, k)).astype(np.float32)
        expected = x.astype(np.float64) @ dequantize(w, qtype, k).astype(np.float64).T
        for shape in ((32, 1), (64, 4), (256, 8)):
            product_entries.clear()
            with tuning.forcing(quantized.MATVEC_TUNED, shape):
                got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, backend="gpu").numpy()
            assert product_entries == ["matvec"]
            assert got.shape == (m, n)
            assert nmse(got, expected) <= NMSE_LONG / 50, (m, shape)


def test_matvec_shape_rule_spreads_a_row_over_its_tasks():
    # Untuned: a thread per 32-value task of a row, 32 to 256 threads; the type's rows,
    # half for GLUs.
    class Untuned:
        backend = pxvm.get_backend("numpy")
    rows = quantized.MATVEC_ROWS
    assert quantized.matvec_shape(Untuned, "Q8_0", 576, False) == (32, rows["Q8_0"])
    assert quantized.matvec_shape(Untuned, "Q4_K", 2048, False) == (64, rows["Q4_K"])
    assert quantized.matvec_shape(Untuned, "Q4_K", 4096, True) == (128, rows["Q4_K"] // 2)
    assert quantized.matvec_shape(Untuned, "Q6_K", 14336, False) == (256, rows["Q6_K"])


def test_matvec_takes_decoding_rows_of_its_types_from_its_shortest_row():
    # On a GPU, untuned: a few rows of Q4_K, Q6_K or Q8_0 from MATVEC_MIN_K values; SmolLM2's
    # K = 576, other types and a prompt's rows take the other kernels; forced, any K.
    class Gpu:
        is_software = False
    least = quantized.MATVEC_MIN_K
    assert quantized.takes_matvec(Gpu, 1, "Q6_K", 2048)
    assert quantized.takes_matvec(Gpu, 31, "Q8_0", least)
    assert not quantized.takes_matvec(Gpu, 1, "Q8_0", 576)
    assert not quantized.takes_matvec(Gpu, 1, "Q4_1", 2048)
    assert not quantized.takes_matvec(Gpu, quantized.TILED_MIN_ROWS, "Q4_K", 2048)
    with tuning.forcing(quantized.MATVEC_TUNED, (32, 1)):
        assert quantized.takes_matvec(Gpu, 1, "Q8_0", 576)


@pytest.mark.parametrize("qtype", TYPES)
def test_matmul_quant_of_many_rows_is_tiled(qtype, rng, gpu_device, product_entries):
    # A prompt's rows take matmul_tiled: M = 37 and N = 50 fill neither a 64-row nor a
    # 64-column tile; K spans several 32-value slices (float rows: K = 75 ends mid-slice).
    m, n = 37, 50
    k = 512 if qtype in K_TYPES else 75 if qtype in ("F32", "F16", "BF16") else 96
    w = _weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, backend="gpu").numpy()
    assert product_entries == ["matmul_tiled"]
    expected = pxvm.ops.matmul_quant.reference(x, w, qtype=qtype, k=k)
    assert got.shape == (m, n)
    assert nmse(got, expected) <= NMSE_LONG / 50


@pytest.mark.parametrize("shape", quantized.TILE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("qtype", ["Q4_1", "Q6_K"])
def test_matmul_quant_tiled_in_every_tile_shape(qtype, shape, rng, gpu_device, product_entries):
    # Each tile shape (the kernel's threads vary with it) on M and N one past a whole
    # number of tiles of every width.
    m, n, k = 129, 129, (512 if qtype in K_TYPES else 96)
    w = _weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    with tuning.forcing(quantized.TILED_TUNED, shape):
        got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, backend="gpu").numpy()
    assert product_entries == ["matmul_tiled"]
    assert nmse(got, pxvm.ops.matmul_quant.reference(x, w, qtype=qtype, k=k)) <= NMSE_LONG / 50


def test_a_tuned_tile_shape_is_the_one_dispatched(rng, gpu_device, monkeypatch):
    # `pxvm tune`'s choice (forced here as the tuner does) wins over TILED_SHAPE.
    assert quantized.TILED_SHAPE != (32, 64)
    seen = record_dispatches(monkeypatch, lambda kernel, entry, constants, groups: (
        entry, constants.get("TILE_M"), constants.get("TILE_N"), constants.get("TILE_RUN"),
        groups))
    x = rng.standard_normal((40, 96)).astype(np.float32)
    w = _weight("Q4_1", 70, 96, rng)
    with tuning.forcing(quantized.TILED_TUNED, (32, 64)):
        got = pxvm.ops.matmul_quant(x, w, qtype="Q4_1", k=96, backend="gpu").numpy()
    # two tiles of 64 columns: a workgroup each on a GPU, one workgroup's run on a CPU driver
    run = quantized.SOFTWARE_TILE_RUN if gpu_device.is_software else 1
    assert seen == [("matmul_tiled", 32, 64, run, (2 if run == 1 else 1, 2, 1))]
    assert nmse(got, pxvm.ops.matmul_quant.reference(x, w, qtype="Q4_1", k=96)) <= NMSE_LONG / 50


def test_matmul_quant_takes_the_tiled_kernel_from_its_row_threshold(rng, gpu_device, product_entries):
    # Fewer rows than TILED_MIN_ROWS, or forced lanes (the tuner's, the tests'), take the
    # row kernel.
    rows = quantized.TILED_MIN_ROWS
    k = 96
    w = _weight("Q4_1", 40, k, rng)
    # (one lane a column, as CPU drivers take, is the row kernel's `matmul_columns`)
    row_entry = "matmul_columns" if gpu_device.is_software else "matmul"
    for m, lanes, entry in ((rows - 1, None, row_entry), (rows, None, "matmul_tiled"),
                            (65, None, "matmul_tiled"), (65, 1, "matmul_columns")):
        product_entries.clear()
        x = rng.standard_normal((m, k)).astype(np.float32)
        with tuning.forcing(quantized.LANES_TUNED, lanes):
            got = pxvm.ops.matmul_quant(x, w, qtype="Q4_1", k=k, backend="gpu").numpy()
        assert product_entries == [entry], (m, lanes)
        expected = pxvm.ops.matmul_quant.reference(x, w, qtype="Q4_1", k=k)
        assert nmse(got, expected) <= NMSE_LONG / 50, (m, lanes)


@pytest.mark.parametrize("qtype", TYPES)
def test_embedding_quant_backends(qtype, rng, gpu_device):
    n, k = 41, (256 if qtype in K_TYPES else 64)
    w = _weight(qtype, n, k, rng)
    ids = rng.integers(0, n, size=9).astype(np.int32)
    expected = dequantize(w, qtype, k)[ids]
    for backend in ("cpu", "gpu"):
        got = pxvm.ops.embedding_quant(ids, w, qtype=qtype, k=k, backend=backend).numpy()
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("backend", ["numpy", "cpu", "gpu"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_embedding_quant_of_a_table_in_parts_adds_up_to_the_whole(qtype, backend, rng,
                                                                   request):
    # a table too large for one GPU buffer is bound in row parts: each part's lookup gives
    # the rows it holds and zeros elsewhere
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    n, k = 41, (256 if qtype in K_TYPES else 64)
    w = _weight(qtype, n, k, rng)
    ids = np.array([0, 16, 17, 40, 5, 33, 16], np.int32)
    expected = dequantize(w, qtype, k)[ids]
    parts = [(0, w[:17]), (17, w[17:30]), (30, w[30:])]
    got = [pxvm.ops.embedding_quant(ids, np.ascontiguousarray(part), qtype=qtype, k=k,
                                    first_row=first, backend=backend).numpy()
           for first, part in parts]
    for (first, part), rows in zip(parts, got):
        held = (ids >= first) & (ids < first + part.shape[0])
        np.testing.assert_array_equal(rows[held], expected[held])
        assert not rows[~held].any()
    np.testing.assert_array_equal(sum(got), expected)
