"""The fast CPU backend's quantized kernels (pxvm.backends.cpu.kernels.quantized): every GGUF type
repacked and dequantized exactly as the `gguf` package dequantizes it, and products on
decoding (one row) and prompt (many rows) shapes against float64 numpy, on odd shapes
(rows that do not fill a tile, a single row, tiles split among threads). Decoding
multiplies integers (the activations quantized to two int16 terms a block): its products
keep float32's precision with outliers in a block, never wrap on the largest values, and
are NaN where float ones are."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numba
import numpy as np
import pytest
from conftest import NMSE_LONG, nmse

from pxvm.backends.cpu.kernels import quantized

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "llm"))
from gguf_blocks import FORMATS, quantize, random_blocks  # noqa: E402

TYPES = sorted(FORMATS)
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def _weight(qtype, n, k, rng):
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng, scale=rng.uniform(0.01, 10))
    return quantize((rng.standard_normal((n, k)) * rng.uniform(0.01, 10)).astype(np.float32),
                    qtype)


def _gguf_values(raw, qtype, n, k):
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]),
                      np.float32).reshape(n, k)


def test_the_kernels_cover_every_type_pxvm_reads():
    assert sorted(t.name for t in quantized.TYPES) == TYPES


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("n", [1, 63, 64, 130])
def test_packed_weights_dequantize_to_gguf_values_exactly(qtype, n, rng):
    k = 512
    raw = _weight(qtype, n, k, rng)
    packed = quantized.pack(raw, qtype, k)
    assert (packed.n, packed.k) == (n, k)
    np.testing.assert_array_equal(quantized.dequantize(packed), _gguf_values(raw, qtype, n, k))


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m,n", [(1, 1), (1, 97), (1, 320), (2, 97), (7, 200), (33, 130)])
def test_products_match_float64_numpy(qtype, m, n, rng):
    k = 512 if qtype in K_TYPES else 96
    raw = _weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    expected = x.astype(np.float64) @ _gguf_values(raw, qtype, n, k).astype(np.float64).T
    out = np.full((m, n), np.nan, np.float32)   # every output must be written
    got = quantized.matmul(x, quantized.pack(raw, qtype, k), out)
    assert got is out
    if m == 1:
        # decoding rounds x to int16 steps of its block's largest |x| / 32767 (one term,
        # without outliers): each output within half a step times sum |w|, however much
        # its products cancel (a single output's NMSE does not bound that)
        w = np.abs(_gguf_values(raw, qtype, n, k).astype(np.float64))
        step = np.repeat(np.abs(x[0]).reshape(-1, 32).max(axis=1), 32) / 32767
        bound = w @ (step / 2) + 1e-6 * (w @ np.abs(x[0]))
        assert (np.abs(got[0] - expected[0]) <= bound).all()
    if n > 1:
        assert nmse(got, expected) <= NMSE_LONG / 50


@pytest.mark.parametrize("threads", [1, 2])
def test_prompt_products_split_among_threads_cover_every_row_once(threads, rng, monkeypatch):
    # a small dequantization step makes each thread's share several steps long, the last
    # one short: no row may be skipped or computed by two threads at once
    monkeypatch.setattr(quantized, "DEQUANTIZE_VALUES", 2 * 64 * 96)
    previous = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        raw = _weight("Q4_1", 64 * 9 + 5, 96, rng)
        x = rng.standard_normal((5, 96)).astype(np.float32)
        got = quantized.matmul(x, quantized.pack(raw, "Q4_1", 96))
    finally:
        numba.set_num_threads(previous)
    expected = x.astype(np.float64) @ _gguf_values(raw, "Q4_1", 64 * 9 + 5, 96).T
    assert nmse(got, expected) <= NMSE_LONG / 50


@pytest.mark.parametrize("qtype", TYPES)
def test_embedding_rows_are_gguf_rows(qtype, rng):
    k = 256
    raw = _weight(qtype, 41, k, rng)
    ids = np.array([40, 0, 7, 7, 13], np.int32)
    out = np.full((5, k), np.nan, np.float32)
    quantized.embed(raw, ids, qtype, k, 0, out)
    np.testing.assert_array_equal(out, _gguf_values(raw, qtype, 41, k)[ids])


def test_pack_refuses_a_type_without_a_kernel():
    with pytest.raises(ValueError, match="no CPU kernel for GGML type Q8_1"):
        quantized.pack(np.zeros((2, 40), np.uint8), "Q8_1", 32)


def _q8_0_rows(values: np.ndarray, d: float) -> np.ndarray:
    """Raw Q8_0 rows of int8 `values` (N, K), every block's scale `d`."""
    blocks = values.astype(np.int8).view(np.uint8).reshape(-1, 32)
    head = np.full((len(blocks), 1), d, np.float16).view(np.uint8)
    return np.concatenate([head, blocks], axis=1).reshape(len(values), -1)


def test_scales_are_float16_where_that_is_exact(rng):
    k = 256
    for qtype, half in [("Q4_0", True), ("Q4_1", True), ("Q8_0", True), ("Q4_K", False),
                        ("Q6_K", False)]:
        packed = quantized.pack(_weight(qtype, 70, k, rng), qtype, k)
        assert (packed.scale.dtype == quantized.HALF) == half, qtype
    # Q4_0's offset -8 d is no float16 where d is above 65504 / 8: float32 then, exactly
    raw = quantize(rng.standard_normal((3, 64)).astype(np.float32) * 1e5, "Q4_0")
    packed = quantized.pack(raw, "Q4_0", 64)
    assert packed.scale.dtype == np.float32
    np.testing.assert_array_equal(quantized.dequantize(packed), _gguf_values(raw, "Q4_0", 3, 64))


@pytest.mark.parametrize("order", ["C", "F"])
def test_rows_dequantize_from_any_tile_into_any_layout(order, rng):
    n, k = 64 * 3 + 21, 96
    for qtype in ("Q4_1", "Q8_0"):
        raw = _weight(qtype, n, k, rng)
        expected = _gguf_values(raw, qtype, n, k)
        out = np.full((n - 64, k), np.nan, np.float32, order=order)
        quantized.dequantize_rows(quantized.pack(raw, qtype, k), 1, out)
        np.testing.assert_array_equal(out, expected[64:])


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_decoding_keeps_float32_precision_beside_outliers(qtype, rng):
    # one value of each block 1000 times the others: quantized to one int16 term with the
    # block's scale, the others would keep only their top few bits (NMSE about 1e-4 here)
    k = 1024
    raw = _weight(qtype, 130, k, rng)
    w = _gguf_values(raw, qtype, 130, k).astype(np.float64)
    rest = rng.standard_normal((1, k)).astype(np.float32)
    outliers = np.zeros_like(rest)
    outliers[0, 5::32] = 1000 * rest[0, 5::32]
    rest[0, 5::32] = 0
    got = quantized.matmul(rest + outliers, quantized.pack(raw, qtype, k))
    # what the others add, within float32's rounding of the outliers' larger products
    assert nmse(got - outliers.astype(np.float64) @ w.T, rest.astype(np.float64) @ w.T) <= 1e-7


def test_decoding_sums_of_the_largest_values_do_not_wrap():
    k = 16384
    x = np.full((1, k), -3.0, np.float32)          # every value at int16's extreme
    values = np.full((2, k), -128)                 # and every weight at int8's
    values[1, ::2] = 127
    got = quantized.matmul(x, quantized.pack(_q8_0_rows(values, 1.0), "Q8_0", k))
    np.testing.assert_allclose(got, [[3.0 * 128 * k, 3.0 / 2 * k]], rtol=1e-6)
    raw = quantize(np.tile([[0.0] * 16 + [15.0] * 16], (1, k // 32)), "Q4_1")  # nibbles 0, 15
    got = quantized.matmul(-x, quantized.pack(raw, "Q4_1", k))
    np.testing.assert_allclose(got, [[3.0 * 15 * k / 2]], rtol=1e-6)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_decoding_products_of_nan_or_infinite_activations_are_nan(qtype, rng):
    k = 128
    w = quantized.pack(_weight(qtype, 70, k, rng), qtype, k)
    for bad in (np.nan, np.inf):
        x = rng.standard_normal((1, k)).astype(np.float32)
        x[0, 77] = bad
        assert np.isnan(quantized.matmul(x, w)).all()
    x = np.zeros((1, k), np.float32)   # a block of zeros has no scale to divide by
    np.testing.assert_array_equal(quantized.matmul(x, w), 0)
