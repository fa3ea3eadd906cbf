"""The fast CPU backend's quantized kernels (pxvm.kernels.cpu.quantized): every GGUF type
repacked and dequantized exactly as the `gguf` package dequantizes it, and products on
decoding (one row) and prompt (many rows) shapes against float64 numpy, on odd shapes
(rows that do not fill a tile, a single row, tiles split among threads)."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numba
import numpy as np
import pytest
from conftest import NMSE_LONG, nmse

from pxvm.kernels.cpu import quantized

sys.path.insert(0, str(Path(__file__).parents[2] / "llm"))
from gguf_blocks import FORMATS, quantize, random_blocks  # noqa: E402

TYPES = sorted(FORMATS)
IDS = [FORMATS[t][0] for t in TYPES]
K_TYPES = (12, 14)


def _weight(qtype, n, k, rng):
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng, scale=rng.uniform(0.01, 10))
    return quantize((rng.standard_normal((n, k)) * rng.uniform(0.01, 10)).astype(np.float32),
                    qtype)


def _gguf_values(raw, qtype, n, k):
    return np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType(qtype)),
                      np.float32).reshape(n, k)


def test_the_kernels_cover_every_type_pxvm_reads():
    assert sorted(int(t) for t in quantized.TYPES) == TYPES


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
@pytest.mark.parametrize("n", [1, 63, 64, 130])
def test_packed_weights_dequantize_to_gguf_values_exactly(qtype, n, rng):
    k = 512
    raw = _weight(qtype, n, k, rng)
    packed = quantized.pack(raw, qtype, k)
    assert (packed.n, packed.k) == (n, k)
    np.testing.assert_array_equal(quantized.dequantize(packed), _gguf_values(raw, qtype, n, k))


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
@pytest.mark.parametrize("m,n", [(1, 1), (1, 97), (1, 320), (2, 97), (7, 200), (33, 130)])
def test_products_match_float64_numpy(qtype, m, n, rng):
    k = 512 if qtype in K_TYPES else 96
    raw = _weight(qtype, n, k, rng)
    x = rng.standard_normal((m, k)).astype(np.float32)
    expected = x.astype(np.float64) @ _gguf_values(raw, qtype, n, k).astype(np.float64).T
    out = np.full((m, n), np.nan, np.float32)   # every output must be written
    got = quantized.matmul(x, quantized.pack(raw, qtype, k), out)
    assert got is out
    assert nmse(got, expected) <= NMSE_LONG / 50


@pytest.mark.parametrize("threads", [1, 2])
def test_prompt_products_split_among_threads_cover_every_row_once(threads, rng, monkeypatch):
    # a small dequantization step makes each thread's share several steps long, the last
    # one short: no row may be skipped or computed by two threads at once
    monkeypatch.setattr(quantized, "DEQUANTIZE_VALUES", 2 * 64 * 96)
    previous = numba.get_num_threads()
    numba.set_num_threads(min(threads, numba.config.NUMBA_NUM_THREADS))
    try:
        raw = _weight(3, 64 * 9 + 5, 96, rng)
        x = rng.standard_normal((5, 96)).astype(np.float32)
        got = quantized.matmul(x, quantized.pack(raw, 3, 96))
    finally:
        numba.set_num_threads(previous)
    expected = x.astype(np.float64) @ _gguf_values(raw, 3, 64 * 9 + 5, 96).T
    assert nmse(got, expected) <= NMSE_LONG / 50


@pytest.mark.parametrize("qtype", TYPES, ids=IDS)
def test_embedding_rows_are_gguf_rows(qtype, rng):
    k = 256
    raw = _weight(qtype, 41, k, rng)
    ids = np.array([40, 0, 7, 7, 13], np.int32)
    out = np.full((5, k), np.nan, np.float32)
    quantized.embed(raw, ids, qtype, k, out)
    np.testing.assert_array_equal(out, _gguf_values(raw, qtype, 41, k)[ids])


def test_pack_refuses_a_type_without_a_kernel():
    with pytest.raises(ValueError, match="no CPU kernel for GGML type Q5_0"):
        quantized.pack(np.zeros((2, 22), np.uint8), 6, 32)
