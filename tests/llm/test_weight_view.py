"""Pictures of weights (pxvm.llm.weight_view): every drawn pixel checked through the colour
map against values the gguf package reads and dequantizes on its own (GGUFReader,
quants.dequantize) and matplotlib's map, never against a stored picture; from GGUF files
and pixel containers, read in pieces smaller than a tensor."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf_blocks import quantize, random_blocks
from make_tiny_gguf import TinySpec, write_tiny_gguf
from matplotlib import colormaps

from pxvm.llm import pixel_container, weight_view
from pxvm.llm.weight_view import ModelSource, WeightViewError, draw_model, draw_tensor

K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
LUT = colormaps["RdBu_r"](np.arange(256), bytes=True)[:, :3].astype(np.int64)


def valid_rows(qtype: str, n: int, k: int, rng) -> np.ndarray:
    """Raw rows of finite values of type `qtype`."""
    x = rng.standard_normal((n, k)).astype(np.float32) * 0.1
    x[0, 0] = 2.0  # an outlier
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng, scale=0.1)
    if qtype == "F32":
        return x.view(np.uint8)
    if qtype == "F16":
        return x.astype(np.float16).view(np.uint8)
    return quantize(x, qtype)


def write_gguf(path, tensors: dict) -> None:
    w = gguf.GGUFWriter(str(path), "test")
    for name, (qtype, raw) in tensors.items():
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[qtype])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def reference(path, name: str, what: str = "values") -> np.ndarray:
    """A tensor's (rows, values) as the gguf package reads and dequantizes it, or its
    blocks' float16 scales d (the block's first two bytes, or Q6_K's last two)."""
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    k = int(tensor.shape[0])
    if what == "scales":
        block, size = gguf.GGML_QUANT_SIZES[tensor.tensor_type]
        blocks = np.asarray(tensor.data, np.uint8).reshape(-1, size)
        at = 208 if tensor.tensor_type == gguf.GGMLQuantizationType.Q6_K else 0
        return blocks[:, at:at + 2].copy().view(np.float16).astype(np.float64).reshape(-1, k // block)
    data = np.asarray(tensor.data)
    if tensor.tensor_type in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
        return data.astype(np.float64).reshape(-1, k)
    return gguf.quants.dequantize(data, tensor.tensor_type).astype(np.float64).reshape(-1, k)


def check_colours(pixels: np.ndarray, values: np.ndarray) -> None:
    """Each pixel is its value's colour, -L..L over the map's 256 entries (L four times the
    values' root mean square, or their largest magnitude where smaller; beyond, the
    ends), give or take one entry (float rounding at an entry's edge)."""
    limit = min(np.max(np.abs(values)), 4 * np.sqrt(np.mean(values ** 2)))
    wanted = np.clip(np.floor((0.5 + 0.5 * values / limit) * 256), 0, 255).astype(np.int64)
    found = np.argmin(np.abs(pixels[..., None, :].astype(np.int64) - LUT).sum(-1), axis=-1)
    assert np.array_equal(LUT[found], pixels), "a pixel is no colour of the map"
    assert np.max(np.abs(found - wanted)) <= 1


def box(picture, name: str) -> np.ndarray:
    x, y, w, h = picture.boxes[name]
    return np.asarray(picture.image)[y:y + h, x:x + w]


@pytest.fixture(params=["gguf", "pixels"])
def source_kind(request, monkeypatch):
    """Read from the GGUF file or its pixel container, in pieces of a few rows and tiles of
    a few KB, so that a tensor streams through several of each."""
    monkeypatch.setattr(weight_view, "CHUNK_BYTES", 1000)
    monkeypatch.setattr(pixel_container, "TILE_BYTES", 4096)
    return request.param


def open_source(path, kind: str, tmp_path) -> ModelSource:
    if kind == "gguf":
        return ModelSource(path)
    folder = tmp_path / f"{path.stem}-px"
    pixel_container.pack(path, folder)
    return ModelSource(folder)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K", "Q8_0", "Q4_1", "F16", "F32"])
def test_a_drawn_tensors_pixels_are_its_dequantized_values_through_the_colour_map(
        qtype, source_kind, tmp_path, rng):
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w.weight": (qtype, valid_rows(qtype, 37, 512, rng))})
    picture = draw_tensor(open_source(path, source_kind, tmp_path), "w.weight")
    values = reference(path, "w.weight")
    pixels = box(picture, "w.weight")
    assert pixels.shape[:2] == values.shape  # a pixel a weight
    check_colours(pixels, values)
    assert picture.limits["w.weight"] == pytest.approx(
        min(np.max(np.abs(values)), 4 * np.sqrt(np.mean(values ** 2))), rel=1e-5)


def test_a_tensors_statistics_are_numpys(tmp_path, rng, source_kind):
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w.weight": ("Q4_K", valid_rows("Q4_K", 29, 768, rng))})
    stats = draw_tensor(open_source(path, source_kind, tmp_path), "w.weight").panels[
        "w.weight"].stats
    values = reference(path, "w.weight")
    assert (stats.low, stats.high) == (values.min(), values.max())
    assert stats.mean == pytest.approx(values.mean(), rel=1e-4, abs=1e-7)
    assert stats.std == pytest.approx(values.std(), rel=1e-4)
    peak = np.max(np.abs(values - values.mean())) / values.std()
    assert stats.peak == pytest.approx(peak, rel=1e-3)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K"])
def test_scales_are_each_blocks_float16_scale_through_the_colour_map(qtype, tmp_path, rng,
                                                                     source_kind):
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w.weight": (qtype, valid_rows(qtype, 21, 1024, rng))})
    picture = draw_tensor(open_source(path, source_kind, tmp_path), "w.weight", of_scales=True)
    scales = reference(path, "w.weight", "scales")
    pixels = box(picture, "w.weight")
    assert pixels.shape[:2] == scales.shape  # a pixel a block
    check_colours(pixels, scales)


def test_a_diff_draws_the_difference_of_two_models(tmp_path, rng, source_kind):
    base, tuned = tmp_path / "base.gguf", tmp_path / "tuned.gguf"
    write_gguf(base, {"w.weight": ("Q8_0", valid_rows("Q8_0", 16, 256, rng))})
    write_gguf(tuned, {"w.weight": ("Q4_K", valid_rows("Q4_K", 16, 256, rng))})
    picture = draw_tensor(open_source(tuned, source_kind, tmp_path), "w.weight",
                          other=ModelSource(base))
    check_colours(box(picture, "w.weight"),
                  reference(tuned, "w.weight") - reference(base, "w.weight"))


def test_a_diff_of_models_of_other_shapes_is_refused(tmp_path, rng):
    a, b = tmp_path / "a.gguf", tmp_path / "b.gguf"
    write_gguf(a, {"w.weight": ("Q8_0", valid_rows("Q8_0", 16, 256, rng))})
    write_gguf(b, {"w.weight": ("Q8_0", valid_rows("Q8_0", 8, 256, rng))})
    with pytest.raises(WeightViewError, match="same shapes"):
        draw_model(ModelSource(a), other=ModelSource(b))


def test_scales_of_a_float_tensor_or_an_unknown_tensor_are_one_clear_error(tmp_path, rng):
    path = tmp_path / "m.gguf"
    write_gguf(path, {"n.weight": ("F32", valid_rows("F32", 1, 64, rng))})
    with pytest.raises(WeightViewError, match="no quant blocks"):
        draw_tensor(ModelSource(path), "n.weight", of_scales=True)
    with pytest.raises(WeightViewError, match="no tensor 'x.weight'"):
        draw_tensor(ModelSource(path), "x.weight")


def test_the_whole_model_has_a_panel_per_tensor_a_pixel_a_weight_where_it_fits(tmp_path,
                                                                             source_kind):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(matrix_type="Q4_0", embedding_type="Q8_0"),
                    np.random.default_rng(5))
    picture = draw_model(open_source(path, source_kind, tmp_path))
    names = [t.name for t in gguf.GGUFReader(str(path)).tensors]
    assert sorted(picture.boxes) == sorted(names)
    for name in names:
        values = reference(path, name)
        pixels = box(picture, name)
        if values.shape[0] == 1:  # a vector: one row drawn VECTOR_HEIGHT times
            assert (pixels == pixels[:1]).all()
            pixels = pixels[:1]
        assert pixels.shape[:2] == values.shape, name
        check_colours(pixels, values)
    # layers' panels in rows: blk.1's below blk.0's
    assert picture.boxes["blk.1.attn_q.weight"][1] > picture.boxes["blk.0.attn_q.weight"][1]


def test_a_tensor_larger_than_a_panel_is_pooled_by_the_mean_of_each_pixels_values(tmp_path,
                                                                                 rng):
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w.weight": ("F16", valid_rows("F16", 300, 512, rng))})
    picture = draw_model(ModelSource(path))
    values = reference(path, "w.weight")
    cell = weight_view.CELL
    rows = np.arange(300) * cell // 300      # pixel row of each tensor row
    cols = np.arange(512) * cell // 512
    means = np.array([[values[rows == r][:, cols == c].mean() for c in range(cell)]
                      for r in range(cell)])
    check_colours(box(picture, "w.weight"), means)


def test_a_tensor_over_the_picture_bounds_is_pooled_to_fit_them(tmp_path, rng, monkeypatch):
    monkeypatch.setattr(weight_view, "MAX_TENSOR_SIDE", 100)
    monkeypatch.setattr(weight_view, "MAX_TENSOR_PIXELS", 100 * 50)
    path = tmp_path / "m.gguf"
    write_gguf(path, {"w.weight": ("F16", valid_rows("F16", 300, 512, rng))})
    picture = draw_tensor(ModelSource(path), "w.weight")
    values = reference(path, "w.weight")
    rows, cols = np.arange(300) * 50 // 300, np.arange(512) * 100 // 512
    means = np.array([[values[rows == r][:, cols == c].mean() for c in range(100)]
                      for r in range(50)])
    check_colours(box(picture, "w.weight"), means)
