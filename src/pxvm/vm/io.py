"""Reading and writing .pxi files (RGBA PNG, 8 bits per channel) with Pillow."""

from __future__ import annotations

import io
import os

import numpy as np
from PIL import Image, UnidentifiedImageError

from .protocol import ProgramError, check_image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC close every complete PNG


def load_pxi(source) -> np.ndarray:
    """Read a .pxi (path or bytes) into an (H, W, 4) uint8 array; ProgramError if it is not
    an RGBA PNG."""
    data = source if isinstance(source, (bytes, bytearray)) else None
    name = "the data" if data is not None else os.fspath(source)
    if data is None:
        try:
            with open(source, "rb") as f:
                data = f.read()
        except OSError as exc:
            raise ProgramError(f"cannot read {name}: {exc.strerror}") from exc
    if not data.startswith(PNG_MAGIC):
        raise ProgramError(f"{name} is not a PNG file (a .pxi program is an RGBA PNG)")
    if PNG_END not in data[-12:]:
        raise ProgramError(f"{name} is a damaged PNG: it is truncated (no IEND chunk at the end)")
    try:
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            if im.mode != "RGBA":
                raise ProgramError(f"{name} is a {im.mode} PNG; a .pxi program must be RGBA with "
                                   "8 bits per channel (convert it with Pillow: .convert('RGBA'))")
            arr = np.asarray(im, dtype=np.uint8)
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ProgramError(f"{name} is a damaged PNG: {exc}") from exc
    return check_image(arr.copy())


def save_pxi(img: np.ndarray, path) -> None:
    """Write an (H, W, 4) uint8 image as an RGBA PNG."""
    img = check_image(img)
    try:
        Image.fromarray(img, "RGBA").save(path, format="PNG")
    except OSError as exc:
        raise ProgramError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}") from exc
