"""Drawing a program for people: every pixel enlarged, instructions labelled."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .protocol import MNEMONICS, OP_HALT

LABEL_COLOUR = (255, 220, 120)


def render_program(img: np.ndarray, scale: int = 0, max_side: int = 2048) -> Image.Image:
    """An RGB picture of `img`: each pixel a `scale`-sized cell drawn in its own colour
    (alpha ignored, so data stay visible) with its R value printed when cells are large
    enough, a grid, and row 0's instructions outlined and named in full in a band above."""
    h, w = img.shape[:2]
    if scale <= 0:
        scale = int(max(4, min(48, max_side // max(h, w))))
    font = ImageFont.load_default()
    labels = _instruction_labels(img, font)
    band = _label_band(labels, scale)
    label_h = band.height if band is not None else 0
    rgb = img[..., :3].astype(np.uint8)
    big = np.kron(rgb, np.ones((scale, scale, 1), np.uint8))
    width = max(w * scale, band.width if band is not None else 0)  # the last label whole
    canvas = Image.new("RGB", (width, h * scale + label_h), (24, 24, 24))
    canvas.paste(Image.fromarray(big, "RGB"), (0, label_h))
    if band is not None:
        canvas.paste(band, (0, 0))
    draw = ImageDraw.Draw(canvas)
    if scale >= 8:
        for x in range(w + 1):
            draw.line([(x * scale, label_h), (x * scale, label_h + h * scale)], fill=(60, 60, 60))
        for y in range(h + 1):
            draw.line([(0, label_h + y * scale), (w * scale, label_h + y * scale)], fill=(60, 60, 60))
    if scale >= 20:  # small values are near-black: print each data pixel's R value
        ys, xs = np.nonzero(np.any(img[1:] != 0, axis=2))
        for y, x in zip(ys[:4000] + 1, xs[:4000]):
            draw.text((x * scale + 2, label_h + y * scale + scale // 2 - 5), str(int(img[y, x, 0])),
                      fill=(235, 235, 235), font=font)
    for x in range(len(labels)):
        draw.rectangle([x * scale, label_h, (x + 1) * scale - 1, label_h + scale - 1],
                       outline=(255, 200, 0))
    return canvas


def _instruction_labels(img: np.ndarray, font) -> list[Image.Image]:
    """Row 0's instruction names, up to HALT, each drawn whole and turned to read upwards
    (a column is narrower than a name but as wide as a line of text)."""
    labels = []
    for x in range(img.shape[1]):
        op = int(img[0, x, 0])
        name = MNEMONICS.get(op, f"?{op}")
        left, top, right, bottom = font.getbbox(name)
        text = Image.new("RGB", (right + 2, bottom + 2), (24, 24, 24))
        ImageDraw.Draw(text).text((1, 1), name, fill=LABEL_COLOUR, font=font)
        labels.append(text.rotate(90, expand=True))
        if op == OP_HALT:
            break
    return labels


def _label_band(labels: list[Image.Image], scale: int) -> Image.Image | None:
    """The labels above their columns; where a label is wider than a column, neighbouring
    ones take turns in tiers, each above its own column, so none overlaps another."""
    if not labels:
        return None
    tall = max(label.height for label in labels)
    wide = max(label.width for label in labels)
    tiers = -(-wide // scale)  # columns one label spans
    band = Image.new("RGB", (max(len(labels) * scale, (len(labels) - 1) * scale + wide),
                             tiers * (tall + 2)), (24, 24, 24))
    for x, label in enumerate(labels):
        tier = x % tiers
        bottom = band.height - tier * (tall + 2) - 1  # each name ends just above its tier's floor
        band.paste(label, (x * scale, bottom - label.height))
    return band
