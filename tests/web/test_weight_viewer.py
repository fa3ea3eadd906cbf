"""The page's weight viewer (pxvm.web.weights, static/weights.*): its routes answer the
served model's tensors and PNG tiles whose pixels are the pooled dequantized weights
through the colour map over +-4 times their root mean square (checked against the gguf package's dequantization and
matplotlib's map), bad requests are 400 or 404, and in headless Chromium the viewer
draws a tensor's tiles and zooms."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import sys
from pathlib import Path

import gguf
import numpy as np
import pytest
from matplotlib import colormaps
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from make_tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402

from pxvm.llm import pixel_container  # noqa: E402
from pxvm.web.server import NativeBenchmarks, page_get  # noqa: E402
from pxvm.web.weights import WeightTiles  # noqa: E402

LUT = colormaps["RdBu_r"](np.arange(256), bytes=True)[:, :3].astype(np.int64)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    # a vocabulary of 700 rows: three tiles high at level 0, two levels
    path = tmp_path_factory.mktemp("weights") / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(vocab_size=700, embedding_type="Q8_0"),
                    np.random.default_rng(9))
    return path


def get(weights: WeightTiles, *seg, **query):
    return page_get(["api", "weights", *seg], {k: [str(v)] for k, v in query.items()}, "s",
                    NativeBenchmarks(), weights)


def embedding(path) -> np.ndarray:
    tensor = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == "token_embd.weight")
    return gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float64).reshape(700, 64)


@pytest.mark.parametrize("packed", [False, True], ids=["gguf", "pixels"])
def test_tiles_are_the_pooled_weights_through_the_colour_map(tiny, packed, tmp_path):
    model = tiny
    if packed:
        model = tmp_path / "px"
        pixel_container.pack(tiny, model)
    weights = WeightTiles(str(model))
    status, body, _ = get(weights)
    listing = json.loads(body)
    entry = next(t for t in listing["tensors"] if t["name"] == "token_embd.weight")
    assert status == 200 and entry == {"name": "token_embd.weight", "type": "Q8_0",
                                       "rows": 700, "cols": 64, "levels": 3}
    values = embedding(tiny)
    limit = min(np.max(np.abs(values)), 4 * np.sqrt(np.mean(values ** 2)))
    for z, y, rows in ((0, 2, values[512:700]), (1, 1, None), (2, 0, None)):
        status, body, content_type = get(weights, "tile", tensor="token_embd.weight", z=z,
                                         x=0, y=y)
        assert status == 200 and content_type == "image/png"
        pixels = np.asarray(Image.open(io.BytesIO(body)).convert("RGB")).astype(np.int64)
        f = 2 ** z
        first = y * 256 * f
        block = values[first:first + 256 * f]
        means = np.array([[block[r:r + f, c:c + f].mean() for c in range(0, 64, f)]
                          for r in range(0, len(block), f)])
        wanted = np.clip(np.floor((0.5 + 0.5 * means / limit) * 256), 0, 255).astype(int)
        found = np.argmin(np.abs(pixels[..., None, :] - LUT).sum(-1), axis=-1)
        assert pixels.shape[:2] == means.shape
        assert np.array_equal(LUT[found], pixels) and np.max(np.abs(found - wanted)) <= 1
    stats = json.loads(get(weights, "stats", tensor="token_embd.weight")[1])
    assert stats["limit"] == pytest.approx(limit, rel=1e-4)
    assert stats["max"] == pytest.approx(values.max())


def test_bad_viewer_requests_are_400_or_404(tiny):
    weights = WeightTiles(str(tiny))
    for query, status, words in (
            ({"tensor": "nope", "z": 0, "x": 0, "y": 0}, 404, "no tensor 'nope'"),
            ({"tensor": "token_embd.weight", "z": 3, "x": 0, "y": 0}, 400, "z must be"),
            ({"tensor": "token_embd.weight", "z": 0, "x": 0, "y": 3}, 400, "y must be"),
            ({"tensor": "token_embd.weight", "z": "1e9", "x": 0, "y": 0}, 400, "z must be"),
            ({"z": 0, "x": 0, "y": 0}, 400, "tensor must be given")):
        answer = get(weights, "tile", **query)
        assert answer[0] == status and words in json.loads(answer[1])["error"], answer
    assert get(weights, "nothing")[0] == 404


CHROMIUM = "/usr/bin/chromium"


@pytest.mark.skipif(not os.path.exists(CHROMIUM), reason=f"{CHROMIUM} is missing")
@pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="no playwright")
def test_the_viewer_draws_a_tensor_and_zooms_in_chromium(tiny):
    from playwright.sync_api import sync_playwright

    from pxvm.serve.page import Page
    from pxvm.serve.server import HttpServer

    server = HttpServer(None, page=Page(weights=WeightTiles(str(tiny)))).start()
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=CHROMIUM, headless=True,
                                        args=["--no-sandbox", "--disable-background-networking"])
            try:
                page = browser.new_page()
                errors = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(server.url + "/weights")
                page.click("#tensors li[title='token_embd.weight']")
                page.wait_for_function("() => document.querySelector('#info').textContent"
                                       ".includes('peak')")
                drawn = ("() => { const c = document.querySelector('#view'); const d = c"
                         ".getContext('2d').getImageData(0, 0, c.width, c.height).data; "
                         "for (let i = 3; i < d.length; i += 4) if (d[i]) return true; "
                         "return false; }")
                page.wait_for_function(drawn)
                assert "level 2" in page.inner_text("#where")
                page.focus("#view")
                page.keyboard.press("+")
                assert "level 1" in page.inner_text("#where")
                page.wait_for_function(drawn)
                assert not errors, errors
            finally:
                browser.close()
    finally:
        server.stop()
