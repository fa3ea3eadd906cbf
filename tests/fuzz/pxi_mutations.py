"""Mutated .pxi files for the fuzz tests: valid programs (tests/vm/programs.py's generator,
and the web page's, which chains matmul, bias, requantize, relu and argmax) encoded as PNG
and mutated at three levels: instruction and data pixels (opcodes, row arguments, ROWHI
prefixes, matrix headers declaring huge sizes), the PNG's IHDR fields (dimensions, bit
depth, colour type) and raw bytes (flips, inserts, deletes, truncation)."""

from __future__ import annotations

import io
import struct
import sys
import zlib
from pathlib import Path

import numpy as np
from harness import mutate_bytes
from hypothesis import strategies as st
from PIL import Image

from pxvm.vm.protocol import OP_ROWHI
from pxvm.web.cases import random_program as page_program

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "vm"))
from programs import random_program as vm_program  # after its folder is on the path

DIMENSIONS = [0, 1, 2, 3, 255, 256, 4096, 8192, 65535, 65536, 2**24, 2**26, 2**31 - 1, 2**31,
              2**32 - 1]
# a byte of the IHDR: (offset in the file, struct format, hostile values)
IHDR_FIELDS = {
    "width": (16, ">I", DIMENSIONS),
    "height": (20, ">I", DIMENSIONS),
    "bit depth": (24, ">B", [1, 2, 4, 8, 16, 0, 3, 32, 255]),
    "colour type": (25, ">B", [0, 2, 3, 4, 6, 1, 5, 7, 255]),
    "compression": (26, ">B", [0, 1, 255]),
    "filter": (27, ">B", [0, 1, 255]),
    "interlace": (28, ">B", [0, 1, 2, 255]),
}
# matrix headers (cols low, cols high, rows low, rows high): zero, huge, and just too big
HEADERS = [(0, 0, 0, 0), (255, 255, 255, 255), (1, 0, 255, 255), (255, 255, 1, 0),
           (0, 1, 0, 1), (2, 0, 0, 0), (0, 0, 2, 0)]


def encode(img: np.ndarray) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(img, "RGBA").save(buf, format="PNG")
    return buf.getvalue()


@st.composite
def program(draw) -> np.ndarray:
    seed = draw(st.integers(0, 2**32 - 1))
    return draw(st.sampled_from([vm_program, page_program]))(seed)


# ---- pixel mutations --------------------------------------------------------------------
def _instruction_x(draw, img) -> int:
    """A column of the instruction row, most often among the first (the instructions)."""
    halt = np.flatnonzero(img[0, :, 0] == 0)
    end = int(halt[0]) + 1 if halt.size else img.shape[1]
    return draw(st.integers(0, max(0, min(end, img.shape[1]) - 1)))


def _opcode(draw, img) -> None:
    img[0, _instruction_x(draw, img), 0] = draw(st.one_of(st.integers(0, 11), st.integers(0, 255)))


def _row_argument(draw, img) -> None:
    x = _instruction_x(draw, img)
    channel = draw(st.integers(1, 3))
    last = img.shape[0] - 1  # the last row, and one past it, in low and high bytes
    img[0, x, channel] = draw(st.one_of(
        st.sampled_from([0, 1, 255, last & 255, (last + 1) & 255, (last >> 8) & 255]),
        st.integers(0, 255)))


def _rowhi(draw, img) -> None:
    x = _instruction_x(draw, img)
    img[0, x] = (OP_ROWHI, *(draw(st.sampled_from([0, 1, 2, 255])) for _ in range(3)))


def _no_halt(draw, img) -> None:
    """Instructions up to the end of the row: the executor stops at its end."""
    img[0, :, 0] = draw(st.sampled_from([1, 2, 3, 8]))
    img[0, :, 1:] = 1


def _matrix_header(draw, img) -> None:
    y = draw(st.integers(0, img.shape[0] - 1))
    header = draw(st.one_of(st.sampled_from(HEADERS),
                            st.tuples(*[st.integers(0, 255)] * 4)))
    img[y, 0] = header


def _data_pixel(draw, img) -> None:
    y = draw(st.integers(0, img.shape[0] - 1))
    x = draw(st.integers(0, img.shape[1] - 1))
    img[y, x] = draw(st.tuples(*[st.integers(0, 255)] * 4))


PIXEL_MUTATIONS = [_opcode, _opcode, _row_argument, _row_argument, _rowhi, _no_halt,
                   _matrix_header, _matrix_header, _data_pixel]


# ---- file mutations ---------------------------------------------------------------------
def _ihdr_field(draw, data: bytearray) -> None:
    at, fmt, values = IHDR_FIELDS[draw(st.sampled_from(sorted(IHDR_FIELDS)))]
    old = struct.unpack_from(fmt, data, at)[0]
    limit = 2**32 - 1 if fmt == ">I" else 255
    near = [v for v in (old - 1, old + 1, old * 2, old // 2) if 0 <= v <= limit]
    struct.pack_into(fmt, data, at, draw(st.sampled_from(values + near)))
    if draw(st.integers(0, 9)):  # most often a consistent CRC, so the field itself is tested
        struct.pack_into(">I", data, 29, zlib.crc32(bytes(data[12:29])))


def _bytes(draw, data: bytearray) -> bytearray:
    if not data:
        return data
    # the chunks after the signature most often, anywhere else, the signature rarely
    start, stop = draw(st.sampled_from([(8, 64), (8, 64), (8, len(data)), (0, len(data))]))
    at = draw(st.randoms(use_true_random=False)).randrange(min(start, len(data) - 1),
                                                           max(1, min(stop, len(data))))
    return mutate_bytes(draw, data, at)


@st.composite
def mutated_pxi(draw, pixels: int = 3, ihdr: int = 2, byte_level: int = 2) -> bytes:
    """A valid program with up to `pixels` pixel mutations, then up to `ihdr` IHDR field
    and `byte_level` byte mutations of its PNG; at least one in all."""
    img = draw(program())
    n_pixels = draw(st.integers(0, pixels))
    n_ihdr = draw(st.integers(0, ihdr))
    n_bytes = draw(st.integers(0, byte_level))
    if not n_pixels + n_ihdr + n_bytes:  # the last level allowed gets one
        n_bytes, n_ihdr, n_pixels = (1, 0, 0) if byte_level else (0, 1, 0) if ihdr else (0, 0, 1)
    for _ in range(n_pixels):
        draw(st.sampled_from(PIXEL_MUTATIONS))(draw, img)
    data = bytearray(encode(img))
    for _ in range(n_ihdr):
        _ihdr_field(draw, data)
    for _ in range(n_bytes):
        data = _bytes(draw, data)
    return bytes(data)
