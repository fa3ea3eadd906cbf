"""GGUF block formats: the type table (pxvm.ops.quant_types) and the test suite's numpy
quantize/dequantize (tests/llm/gguf_blocks.py) against the gguf package's own code."""

from __future__ import annotations

import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

import pxvm
from pxvm.ops import quant_types
from pxvm.core.errors import ShapeError

sys.path.insert(0, str(Path(__file__).parent.parent / "llm"))
from gguf_blocks import FORMATS, dequantize, quantize, random_blocks, row_bytes  # noqa: E402

TYPES = sorted(FORMATS)
K_TYPES = ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"]  # 256-value super-blocks, no quantizer
SIMPLE = [t for t in TYPES if t not in K_TYPES]


def _weight(qtype, n, k, rng):
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng)
    return quantize(rng.standard_normal((n, k)).astype(np.float32), qtype)


def test_quant_types_take_their_block_sizes_from_gguf():
    # The kernels get a type's block sizes from QUANT_TYPES; gguf_blocks.FORMATS, written
    # out by hand, is what the tests build weights with: all three must agree.
    assert sorted(quant_types.QUANT_TYPES) == TYPES
    for name, t in quant_types.QUANT_TYPES.items():
        assert t.name == name and t.ggml == GGMLQuantizationType[name]
        assert t.code == int(GGMLQuantizationType[name])  # the number GGUF files write
        assert (t.block_values, t.block_bytes) == GGML_QUANT_SIZES[t.ggml], t.name
        assert (t.block_values, t.block_bytes) == FORMATS[name]
        assert quant_types.row_bytes(name, 512) == row_bytes(name, 512)


@pytest.mark.parametrize("qtype", ["Q8_1", "IQ2_XXS", "q4_k", "unknown"])
def test_quant_type_of_an_unsupported_type_names_the_supported_ones(qtype):
    with pytest.raises(ShapeError, match=f"unsupported weight type '{qtype}'; supported: ") as info:
        quant_types.quant_type(qtype)
    for name in quant_types.QUANT_TYPES:
        assert name in str(info.value)


@pytest.mark.parametrize("number", [12, 8, GGMLQuantizationType.Q4_K])
def test_a_type_given_by_number_is_refused_saying_types_are_named(number):
    with pytest.raises(ShapeError, match=r"a type is named, not numbered.*Q4_K"):
        quant_types.quant_type(number)


@pytest.mark.parametrize("qtype", TYPES)
def test_quant_types_dequantize_matches_the_plain_layouts(qtype, rng):
    # The numpy backend's dequantization (gguf's code) against the layouts written out in
    # gguf_blocks, which the kernels read.
    k = 512
    w = _weight(qtype, 6, k, rng)
    np.testing.assert_array_equal(quant_types.dequantize(w, qtype, k), dequantize(w, qtype, k))


@pytest.mark.parametrize("qtype", K_TYPES)
def test_k_dequantize_matches_gguf(qtype, rng):
    raw = random_blocks(5, 512, qtype, rng, scale=rng.uniform(0.01, 10))
    ours = dequantize(raw, qtype, 512)
    theirs = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]), np.float32)
    np.testing.assert_array_equal(ours, theirs.reshape(5, 512))


@pytest.mark.parametrize("qtype", SIMPLE)
def test_dequantize_matches_gguf(qtype, rng):
    x = (rng.standard_normal((7, 96)) * rng.uniform(0.01, 10)).astype(np.float32)
    x[3, :32] = 0.0  # an all-zero block: scale 0 must not give NaN
    raw = quantize(x, qtype)
    assert raw.dtype == np.uint8 and raw.shape == (7, row_bytes(qtype, 96))
    ours = dequantize(raw, qtype, 96)
    theirs = np.asarray(gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]), np.float32)
    np.testing.assert_array_equal(ours, theirs.reshape(7, 96))
    assert not np.isnan(ours).any()


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "BF16"])
def test_quantize_matches_gguf(qtype, rng):
    x = rng.standard_normal((5, 64)).astype(np.float32)
    theirs = gguf.quants.quantize(x, gguf.GGMLQuantizationType[qtype])
    np.testing.assert_array_equal(quantize(x, qtype), theirs)


@pytest.mark.parametrize("qtype", SIMPLE)
def test_quantization_error_within_one_step(qtype, rng):
    x = rng.standard_normal((4, 128)).astype(np.float32)
    err = np.abs(dequantize(quantize(x, qtype), qtype, 128) - x).reshape(-1, 32)
    blocks = x.reshape(-1, 32)
    span = blocks.max(axis=1) - blocks.min(axis=1)
    # Q4_0's levels are d * (-8..7) with d = extreme / 8 (Q5_0's d * (-16..15), extreme /
    # 16): the far side clamps, up to one step
    amax = np.abs(blocks).max(axis=1)
    # BF16 keeps 8 significant bits: half a step is at most 2^-8 of the block's largest
    steps = {"F32": 0.0, "F16": 0.0, "Q4_0": 2 * amax / 8, "Q4_1": span / 15,
             "Q5_0": 2 * amax / 16, "Q5_1": span / 31, "Q8_0": amax / 127,
             "BF16": amax * 2.0 ** -7}[qtype]
    # half a quantization step, plus the f16 rounding of the scale (relative 2^-11) times
    # the largest level, and f16 rounding of the values themselves for F16
    bound = 0.5 * np.asarray(steps) + amax * 2.0 ** -10 * (qtype != "F32")
    assert np.all(err.max(axis=1) <= bound + 1e-7)


def test_matmul_quant_rejects_wrong_row_bytes(rng):
    w = quantize(rng.standard_normal((4, 64)).astype(np.float32), "Q4_1")
    with pytest.raises(ShapeError, match="needs"):
        pxvm.ops.matmul_quant(np.zeros((1, 64), np.float32), w[:, :-1], qtype="Q4_1", k=64,
                              backend="cpu")
