"""NaN or infinite weights (float values, quantized blocks' scales) are refused when a
weight is read from the file, naming the tensor: they would make every logit NaN."""

from __future__ import annotations

import numpy as np
import pytest
from make_tiny_gguf import TinySpec, write_tiny_gguf

from pxvm.llm import ModelFileError, load_model
from pxvm.llm.gguf_model import GGUFModelFile, NonFiniteWeightError, non_finite_count


@pytest.mark.parametrize("dtype,qtype", [("<f4", "F32"), ("<f2", "F16")])
def test_float_values_counted_as_numpy_sees_them(dtype, qtype):
    values = np.random.default_rng(0).standard_normal(1000).astype(dtype)
    values[[3, 500, 999]] = [np.nan, np.inf, -np.inf]
    assert non_finite_count(qtype, values.view(np.uint8)) == \
        np.count_nonzero(~np.isfinite(values)) == 3


def test_bfloat16_values_counted():
    as_f32 = np.array([1.0, np.nan, -np.inf, 3e38, -2.5], np.float32)
    bf16 = (as_f32.view(np.uint32) >> 16).astype(np.uint16)  # bfloat16: the top half
    assert non_finite_count("BF16", bf16.view(np.uint8)) == 2


def test_quantized_scales_counted_where_the_block_layout_keeps_them():
    # Q6_K: 210-byte blocks whose float16 scale d is the last two bytes
    blocks = np.zeros((4, 210), np.uint8)
    blocks[:, 208:210] = np.array([1.0, np.nan, np.inf, 2.0], "<f2").view(np.uint8).reshape(4, 2)
    blocks[:, :208] = 0xFF  # quants are not scales: all-ones bytes there are fine
    assert non_finite_count("Q6_K", blocks) == 2


def _tiny(tmp_path, **spec):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(**spec), np.random.default_rng(0))
    return path


@pytest.mark.parametrize("tensor,matrix_type,value_at", [
    ("output_norm.weight", "Q4_1", 5),  # F32 values
    ("blk.0.attn_q.weight", "Q4_1", 2),  # the m scale of the first block
    ("blk.0.ffn_down.weight", "Q8_0", 0),  # the d scale
    ("blk.1.attn_v.weight", "F16", 6),
])
def test_a_file_with_a_non_finite_weight_is_refused_naming_the_tensor(tmp_path, tensor,
                                                                       matrix_type, value_at):
    path = _tiny(tmp_path, matrix_type=matrix_type)
    info = GGUFModelFile(str(path)).tensors[tensor]
    data = bytearray(path.read_bytes())
    width = 4 if info.type_name == "F32" else 2
    nan = np.array([np.nan], "<f4" if width == 4 else "<f2").tobytes()
    at = info.offset + (value_at * width if info.type_name in ("F32", "F16") else value_at)
    data[at:at + width] = nan
    path.write_bytes(bytes(data))
    with pytest.raises(NonFiniteWeightError, match=f"tensor '{tensor}'.*NaN or infinite") as e:
        load_model(str(path), backend="numpy", progress=False)
    assert isinstance(e.value, ModelFileError) and str(path) in str(e.value)


def test_finite_files_still_load(tmp_path):
    model = load_model(str(_tiny(tmp_path)), backend="numpy", progress=False)
    assert np.isfinite(model.forward([1, 2])).all()
