"""Drawing a program for people: every pixel enlarged, instructions labelled."""

from __future__ import annotations

import numpy as np
from PIL import Image, ImageDraw, ImageFont

from .protocol import MNEMONICS, OP_HALT


def render_program(img: np.ndarray, scale: int = 0, max_side: int = 2048) -> Image.Image:
    """An RGB picture of `img`: each pixel a `scale`-sized cell drawn in its own colour
    (alpha ignored, so data stay visible) with its R value printed when cells are large
    enough, a grid, and row 0's instructions labelled."""
    h, w = img.shape[:2]
    if scale <= 0:
        scale = int(max(4, min(48, max_side // max(h, w))))
    rgb = img[..., :3].astype(np.uint8)
    big = np.kron(rgb, np.ones((scale, scale, 1), np.uint8))
    label_h = 14 if scale < 30 else 0
    canvas = Image.new("RGB", (w * scale, h * scale + label_h), (24, 24, 24))
    canvas.paste(Image.fromarray(big, "RGB"), (0, label_h))
    draw = ImageDraw.Draw(canvas)
    if scale >= 8:
        for x in range(w + 1):
            draw.line([(x * scale, label_h), (x * scale, label_h + h * scale)], fill=(60, 60, 60))
        for y in range(h + 1):
            draw.line([(0, label_h + y * scale), (w * scale, label_h + y * scale)], fill=(60, 60, 60))
    font = ImageFont.load_default()
    if scale >= 20:  # small values are near-black: print each data pixel's R value
        ys, xs = np.nonzero(np.any(img[1:] != 0, axis=2))
        for y, x in zip(ys[:4000] + 1, xs[:4000]):
            draw.text((x * scale + 2, label_h + y * scale + scale // 2 - 5), str(int(img[y, x, 0])),
                      fill=(235, 235, 235), font=font)
    for x in range(w):
        op = int(img[0, x, 0])
        name = MNEMONICS.get(op, f"?{op}")
        short = name if scale >= 48 else name.split("_")[0][:4]
        if label_h:
            draw.text((x * scale + 1, 1), short, fill=(255, 220, 120), font=font)
        else:
            draw.text((x * scale + 2, 2), short, fill=(255, 220, 120), font=font)
        draw.rectangle([x * scale, label_h, (x + 1) * scale - 1, label_h + scale - 1],
                       outline=(255, 200, 0))
        if op == OP_HALT:
            break
    return canvas
