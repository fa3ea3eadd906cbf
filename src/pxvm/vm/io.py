"""Reading and writing .pxi files (RGBA PNG, 8 bits per channel) with Pillow.

A file is checked before Pillow decodes anything: its size, and its IHDR chunk
(dimensions, bit depth, colour type), so that a forged header is refused before the
image is allocated, with an error naming the field, its value and the bound.
"""

from __future__ import annotations

import io
import os
import struct
import warnings
import zlib
from dataclasses import dataclass

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..core.files import check_regular_file
from .protocol import MAX_PIXELS, ProgramError, check_image

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
PNG_END = b"IEND\xaeB`\x82"  # the IEND chunk's type and CRC close every complete PNG
#: Largest .pxi file read: the largest image stored uncompressed takes 4 bytes a pixel and
#: a filter byte a row (at most half a byte a pixel, the width being at least 2), and
#: deflate's and the chunks' headers add well under half a byte a pixel more.
MAX_FILE_BYTES = 5 * MAX_PIXELS
#: Deflate expands data at most 1032-fold (a 258-byte match in 2 bits), so a file of n
#: bytes cannot hold more than this many times n bytes of image data.
MAX_DEFLATE_RATIO = 1032
#: Decoded pixels are copied out of Pillow a strip of about this many bytes at a time.
STRIP_BYTES = 1 << 22
COLOUR_TYPES = {0: "greyscale", 2: "RGB", 3: "palette", 4: "greyscale with alpha", 6: "RGBA"}
#: The IHDR chunk after its length: type, width, height, bit depth, colour type,
#: compression, filter, interlace, CRC.
_IHDR = struct.Struct(">4sIIBBBBBI")


class ImageTooLarge(ProgramError):
    """The file's header declares more pixels than the reader accepts."""


@dataclass(frozen=True)
class PngHeader:
    width: int
    height: int
    bit_depth: int
    colour_type: int
    interlace: int

    @property
    def pixels(self) -> int:
        return self.width * self.height

    @property
    def raw_bytes(self) -> int:
        """Bytes of image data once inflated (non-interlaced: a filter byte a row)."""
        return self.height * (1 + 4 * self.width)


def read_png_header(data: bytes, name: str = "the data", max_pixels: int = MAX_PIXELS) -> PngHeader:
    """The checked IHDR of a .pxi file's bytes; ProgramError naming the field, its value
    and the bound if the file is not an 8-bit RGBA PNG of at most `max_pixels` pixels
    that its own size can hold. Nothing is decoded."""
    if not data.startswith(PNG_MAGIC):
        raise ProgramError(f"{name} is not a PNG file (a .pxi program is an RGBA PNG)")
    if len(data) < len(PNG_MAGIC) + 4 + _IHDR.size:
        raise ProgramError(f"{name} is a damaged PNG: it ends before its IHDR chunk")
    length = int.from_bytes(data[8:12], "big")
    tag, width, height, depth, colour, compression, filtering, interlace, crc = \
        _IHDR.unpack_from(data, 12)
    if tag != b"IHDR" or length != 13:
        raise ProgramError(f"{name} is a damaged PNG: its first chunk is {tag!r} of {length} "
                           "bytes, not the 13-byte IHDR")
    if zlib.crc32(data[12:29]) != crc:
        raise ProgramError(f"{name} is a damaged PNG: the IHDR chunk's CRC does not match")
    if width < 2 or height < 1:
        raise ProgramError(f"{name} is {width}x{height} pixels; a .pxi program needs a width "
                           "of at least 2 and a height of at least 1")
    if width * height > max_pixels:
        raise ImageTooLarge(f"{name} is {width}x{height} = {width * height:,} pixels; at most "
                           f"{max_pixels:,} are accepted")
    if depth != 8 or colour != 6:
        kind = COLOUR_TYPES.get(colour, f"colour type {colour}")
        raise ProgramError(f"{name} is a PNG of bit depth {depth} and colour type {colour} "
                           f"({kind}); a .pxi program must be RGBA with 8 bits per channel "
                           "(bit depth 8, colour type 6)")
    if compression != 0 or filtering != 0 or interlace not in (0, 1):
        raise ProgramError(f"{name} is a damaged PNG: IHDR compression {compression}, filter "
                           f"{filtering}, interlace {interlace} (PNG defines 0, 0 and 0 or 1)")
    header = PngHeader(width, height, depth, colour, interlace)
    if header.raw_bytes > MAX_DEFLATE_RATIO * len(data):
        raise ProgramError(
            f"{name} declares {width}x{height} pixels ({header.raw_bytes:,} bytes of image "
            f"data) in a file of {len(data):,} bytes, more than deflate can expand "
            f"({MAX_DEFLATE_RATIO}-fold): the file is truncated or its header forged")
    return header


def _read(source) -> tuple[bytes, str]:
    if isinstance(source, (bytes, bytearray, memoryview)):
        data = bytes(source)
        if len(data) > MAX_FILE_BYTES:
            raise ProgramError(f"the data is {len(data):,} bytes; a .pxi file has at most "
                               f"{MAX_FILE_BYTES:,}")
        return data, "the data"
    name = os.fspath(source)
    check_regular_file(source, ".pxi program", ProgramError)
    try:
        with open(source, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > MAX_FILE_BYTES:
                raise ProgramError(f"{name} is {size:,} bytes; a .pxi file has at most "
                                   f"{MAX_FILE_BYTES:,}")
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ProgramError(f"cannot read {name}: {exc.strerror or exc}") from exc
    if len(data) > MAX_FILE_BYTES:  # not a regular file, or it grew while read
        raise ProgramError(f"{name} has more than {MAX_FILE_BYTES:,} bytes, the most a .pxi "
                           "file has")
    return data, name


def load_pxi(source, max_pixels: int = MAX_PIXELS) -> np.ndarray:
    """Read a .pxi (path or bytes) into an (H, W, 4) uint8 array; ProgramError if it is not
    an 8-bit RGBA PNG of at most `max_pixels` pixels (checked before decoding)."""
    data, name = _read(source)
    read_png_header(data, name, max_pixels)
    if PNG_END not in data[-12:]:
        raise ProgramError(f"{name} is a damaged PNG: it is truncated (no IEND chunk at the end)")
    return check_image(_decode(data, name))


def _decode(data: bytes, name: str) -> np.ndarray:
    """The pixels of a checked PNG, copied out of Pillow's image a strip of rows at a time
    (Pillow's own array export builds two more copies of the whole image)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            with Image.open(io.BytesIO(data), formats=("PNG",)) as im:
                im.load()
                if im.mode != "RGBA":
                    raise ProgramError(f"{name} is a {im.mode} PNG; a .pxi program must be RGBA "
                                       "with 8 bits per channel")
                w, h = im.size
                pixels = np.empty((h, w, 4), np.uint8)
                step = max(1, STRIP_BYTES // (4 * w))
                for y in range(0, h, step):
                    strip = im.crop((0, y, w, min(h, y + step))).tobytes()
                    pixels[y: y + step] = np.frombuffer(strip, np.uint8).reshape(-1, w, 4)
                return pixels
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise ProgramError(f"{name} is refused by Pillow as a decompression bomb: {exc}") from exc
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError, EOFError,
            struct.error, zlib.error) as exc:
        raise ProgramError(f"{name} is a damaged PNG: {exc}") from exc


def save_pxi(img: np.ndarray, path) -> None:
    """Write an (H, W, 4) uint8 image as an RGBA PNG."""
    img = check_image(img)
    try:
        Image.fromarray(img, "RGBA").save(path, format="PNG")
    except OSError as exc:
        raise ProgramError(f"cannot write {os.fspath(path)}: {exc.strerror or exc}") from exc
