"""GGUF block formats: the type table (pxvm.ops.quant_types) and the test suite's numpy
quantize/dequantize (tests/llm/gguf_blocks.py) against the gguf package's own code, and
the quantized ops (matmul_quant, embedding_quant) on both backends."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from conftest import NMSE_LONG, nmse, record_dispatches
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

import pxvm
from pxvm.ops import quant_types, quantized, tuning
from pxvm.runtime.errors import ShapeError
from pxvm.web.plans import record_op

sys.path.insert(0, str(Path(__file__).parent.parent / "llm"))
from gguf_blocks import FORMATS, dequantize, quantize, random_blocks, row_bytes  # noqa: E402

TYPES = sorted(FORMATS)
IDS = [FORMATS[t][0] for t in TYPES]
K_TYPES = [10, 11, 12, 13, 14]  # 256-value super-blocks, no quantizer: tested on random valid blocks
SIMPLE = [t for t in TYPES if t not in K_TYPES]
SIMPLE_IDS = [FORMATS[t][0] for t in SIMPLE]


def _weight(qtype, n, k, rng):
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng)
    return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


def test_quant_types_take_their_block_sizes_from_gguf():
    # The kernels get a type's block sizes from QUANT_TYPES; gguf_blocks.FORMATS, written
    # out by hand, is what the tests build weights with: all three must agree.
    assert sorted(quant_types.QUANT_TYPES) == TYPES
    for code, t in quant_types.QUANT_TYPES.items():
        assert t.code == code and t.ggml == GGMLQuantizationType(code)
        assert (t.block_values, t.block_bytes) == GGML_QUANT_SIZES[t.ggml], t.name
        assert (t.name, t.block_values, t.block_bytes) == FORMATS[code]
        assert quant_types.row_bytes(code, 512) == row_bytes(code, 512)


@pytest.mark.parametrize("code", [9, 16, 99], ids=["Q8_1", "IQ2_XXS", "unknown"])
def test_quant_type_of_an_unsupported_type_names_the_supported_ones(code):
    with pytest.raises(ShapeError, match=f"unsupported weight type {code}; supported: ") as info:
        quant_types.quant_type(code)
    for t in quant_types.QUANT_TYPES.values():
        assert f"{t.code} ({t.name})" in str(info.value)


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_quant_types_dequantize_matches_the_plain_layouts(qtype, rng):
    # The numpy backend's dequantization (gguf's code) against the layouts written out in
    # gguf_blocks, which the kernels read.
    k = 512
    w = _weight(qtype, 6, k, rng)
    np.testing.assert_array_equal(quant_types.dequantize(w, qtype, k), dequantize(w, qtype, k))


@pytest.mark.parametrize("qtype", K_TYPES, ids=["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_k_dequantize_matches_gguf(qtype, rng):
    raw = random_blocks(5, 512, qtype, rng, scale=rng.uniform(0.01, 10))
    ours = dequantize(raw, qtype, 512)
    theirs = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)), np.float32)
    np.testing.assert_array_equal(ours, theirs.reshape(5, 512))


@pytest.mark.parametrize("qtype", SIMPLE, ids=SIMPLE_IDS)
def test_dequantize_matches_gguf(qtype, rng):
    x = (rng.standard_normal((7, 96)) * rng.uniform(0.01, 10)).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block: scale 0 must not give NaN
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (7, row_bytes(qtype, 96))
    ours = dequantize(raw, qtype, 96)
    theirs = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)), np.float32)
    np.testing.assert_array_equal(ours, theirs.reshape(7, 96))
    assert not np.isnan(ours).any()


@pytest.mark.parametrize("qtype", [2, 3, 6, 7, 8, 30],
                         ids=["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16"])
def test_quantize_matches_gguf(qtype, rng):
    x = rng.standard_normal((5, 64)).astype(np.float32)
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType(qtype))
    np.testing.assert_array_equal(quantize(x, qtype), theirs)


@pytest.mark.parametrize("qtype", SIMPLE, ids=SIMPLE_IDS)
def test_quantization_error_within_one_step(qtype, rng):
    x = rng.standard_normal((4, 128)).astype(np.float32)
    err = np.abs(dequantize(quantize(x, qtype), qtype, 128) - x).reshape(-1, 32)
    blocks = x.reshape(-1, 32)
    span = blocks.max(axis=1) - blocks.min(axis=1)
    # Q4_0's levels are d * (-8..7) with d = extreme / 8 (Q5_0's d * (-16..15), extreme /
    # 16): the far side clamps, up to one step
    amax = np.abs(blocks).max(axis=1)
    # BF16 keeps 8 significant bits: half a step is at most 2^-8 of the block's largest
    steps = {0: 0.0, 1: 0.0, 2: 2 * amax / 8, 3: span / 15, 6: 2 * amax / 16, 7: span / 31,
             8: amax / 127, 30: amax * 2.0 ** -7}[qtype]
    # half a quantization step, plus the f16 rounding of the scale (relative 2^-11) times
    # the largest level, and f16 rounding of the values themselves for F16
    bound = 0.5 * np.asarray(steps) + amax * 2.0 ** -10 * (qtype != 0)
    assert np.all(err.max(axis=1) <= bound + 1e-7)


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
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
        got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, lanes=lanes, backend=backend).numpy()
        assert got.shape == (m, n)
        assert nmse(got, expected) <= NMSE_LONG / 50, (backend, lanes)
        if lanes and lanes > 1:
            assert [kernel for kernel, _ in dispatched] == [
                quantized.SUBGROUP_KERNEL if subgroups else quantized.KERNEL]


@pytest.mark.parametrize("features,lanes,variants,kernel", [
    (("subgroup",), 4, True, "matmul_quant_subgroups.wgsl"),
    (("subgroup",), 1, True, "matmul_quant.wgsl"),    # nothing to sum
    (("subgroup",), 4, False, "matmul_quant.wgsl"),
    ((), 4, True, "matmul_quant.wgsl"),                # a device without subgroups
])
def test_row_products_sum_by_subgroups_where_granted(features, lanes, variants, kernel, rng,
                                                     monkeypatch):
    monkeypatch.setattr(tuning, "SUBGROUP_KERNELS", variants)
    x = rng.standard_normal((1, 64)).astype(np.float32)
    w = _weight(8, 16, 64, rng)
    [dispatch] = record_op(pxvm.ops.matmul_quant, [x, w], {"qtype": 8, "k": 64,
                                                           "lanes": lanes}, features)["dispatches"]
    assert (dispatch["kernel"], dispatch["entry"]) == (kernel, "matmul")


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_matmul_quant_of_many_rows_is_tiled(qtype, rng, gpu_device, product_entries):
    # A prompt's rows take matmul_tiled: M = 37 and N = 50 fill neither a 64-row nor a
    # 64-column tile; K spans several 32-value slices (float rows: K = 75 ends mid-slice).
    m, n = 37, 50
    k = 512 if qtype in K_TYPES else 75 if qtype in (0, 1, 30) else 96
    w = _weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, backend="gpu").numpy()
    assert product_entries == ["matmul_tiled"]
    expected = pxvm.ops.matmul_quant.reference(x, w, qtype=qtype, k=k)
    assert got.shape == (m, n)
    assert nmse(got, expected) <= NMSE_LONG / 50


@pytest.mark.parametrize("shape", quantized.TILE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("qtype", [3, 14], ids=["Q4_1", "Q6_K"])
def test_matmul_quant_tiled_in_every_tile_shape(qtype, shape, rng, gpu_device, product_entries,
                                                monkeypatch):
    # Each TILED_SHAPE (the kernel's threads vary with it) on M and N one past a whole
    # number of tiles of every width.
    monkeypatch.setattr(quantized, "TILED_SHAPE", shape)
    m, n, k = 129, 129, (512 if qtype in K_TYPES else 96)
    w = _weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, backend="gpu").numpy()
    assert product_entries == ["matmul_tiled"]
    assert nmse(got, pxvm.ops.matmul_quant.reference(x, w, qtype=qtype, k=k)) <= NMSE_LONG / 50


def test_a_tuned_tile_shape_is_the_one_dispatched(rng, gpu_device, monkeypatch):
    # `pxvm tune`'s choice (forced here as the tuner does) wins over TILED_SHAPE.
    seen = record_dispatches(monkeypatch, lambda kernel, entry, constants, groups: (
        entry, constants.get("TILE_M"), constants.get("TILE_N"), groups))
    x = rng.standard_normal((40, 96)).astype(np.float32)
    w = _weight(3, 70, 96, rng)
    with tuning.forcing(quantized.TILED_TUNED, (32, 64)):
        got = pxvm.ops.matmul_quant(x, w, qtype=3, k=96, backend="gpu").numpy()
    assert seen == [("matmul_tiled", 32, 64, (2, 2, 1))]
    assert nmse(got, pxvm.ops.matmul_quant.reference(x, w, qtype=3, k=96)) <= NMSE_LONG / 50


@pytest.mark.parametrize("shape", [(32, 128), (128, 32), (16, 64), (96, 64)],
                         ids=["32x128", "128x32", "16x64", "96x64"])
def test_matmul_quant_tiled_rejects_other_tile_shapes(shape, rng, gpu_device, monkeypatch):
    monkeypatch.setattr(quantized, "TILED_SHAPE", shape)
    x = rng.standard_normal((40, 96)).astype(np.float32)
    with pytest.raises(ValueError, match="TILED_SHAPE must be one of"):
        pxvm.ops.matmul_quant(x, _weight(3, 8, 96, rng), qtype=3, k=96, backend="gpu")


def test_matmul_quant_takes_the_tiled_kernel_from_its_row_threshold(rng, gpu_device, product_entries):
    # Fewer rows than TILED_MIN_ROWS, or a `lanes` asked for, take the row kernel.
    rows = quantized.TILED_MIN_ROWS
    k = 96
    w = _weight(3, 40, k, rng)
    for m, lanes, entry in ((rows - 1, None, "matmul"), (rows, None, "matmul_tiled"),
                            (65, None, "matmul_tiled"), (65, 1, "matmul")):
        product_entries.clear()
        x = rng.standard_normal((m, k)).astype(np.float32)
        got = pxvm.ops.matmul_quant(x, w, qtype=3, k=k, lanes=lanes, backend="gpu").numpy()
        assert product_entries == [entry], (m, lanes)
        expected = pxvm.ops.matmul_quant.reference(x, w, qtype=3, k=k)
        assert nmse(got, expected) <= NMSE_LONG / 50, (m, lanes)


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_embedding_quant_backends(qtype, rng, gpu_device):
    n, k = 41, (256 if qtype in K_TYPES else 64)
    w = _weight(qtype, n, k, rng)
    ids = rng.integers(0, n, size=9).astype(np.int32)
    expected = dequantize(w, qtype, k)[ids]
    for backend in ("cpu", "gpu"):
        got = pxvm.ops.embedding_quant(ids, w, qtype=qtype, k=k, backend=backend).numpy()
        np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("backend", ["numpy", "cpu", "gpu"])
@pytest.mark.parametrize("qtype", [8, 12], ids=["Q8_0", "Q4_K"])
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


def test_matmul_quant_rejects_wrong_row_bytes(rng):
    w = quantize(rng.standard_normal((4, 64)).astype(np.float32), 3)
    with pytest.raises(ShapeError, match="needs"):
        pxvm.ops.matmul_quant(np.zeros((1, 64), np.float32), w[:, :-1], qtype=3, k=64,
                              backend="cpu")
