"""Reading .pxi files: the IHDR chunk and the file's size are checked before Pillow decodes
anything, and every refusal is one ProgramError naming the field, its value and the bound."""

import io
import struct
import time
import zlib

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from pxvm.vm import ProgramError, io as pxi_io, load_pxi
from pxvm.vm.io import ImageTooLarge, read_png_header
from pxvm.vm.protocol import MAX_PIXELS


def chunk(tag: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + tag + data + struct.pack(">I", zlib.crc32(tag + data))


def png(width, height, depth=8, colour=6, idat=None, interlace=0) -> bytes:
    """A PNG written by hand, so that any IHDR can be declared (Pillow writes only what it
    supports); the image data are zero rows of the declared format unless given."""
    if idat is None:
        channels = {0: 1, 2: 3, 3: 1, 4: 2, 6: 4}[colour]
        row = 1 + (width * channels * depth + 7) // 8
        idat = zlib.compress(bytes(row * height))
    ihdr = struct.pack(">IIBBBBB", width, height, depth, colour, 0, 0, interlace)
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", idat)
            + chunk(b"IEND", b""))


def pillow_png(arr, mode="RGBA") -> bytes:
    buf = io.BytesIO()
    Image.fromarray(arr, mode).save(buf, format="PNG")
    return buf.getvalue()


def test_a_hand_written_rgba_png_loads():
    img = load_pxi(png(5, 3))
    assert img.shape == (3, 5, 4) and img.dtype == np.uint8 and not img.any()
    img[0, 0] = 1  # writable: programs are edited in place


def test_pixels_are_copied_out_strip_by_strip_exactly(monkeypatch):
    arr = np.random.default_rng(1).integers(0, 256, (37, 11, 4), dtype=np.uint8)
    data = pillow_png(arr)
    for strip in (1, 44, 45, 1000, 1 << 22):  # under a row, one row, rows and a rest, all
        monkeypatch.setattr(pxi_io, "STRIP_BYTES", strip)
        np.testing.assert_array_equal(load_pxi(data), arr)


def test_a_20000x20000_header_is_a_clear_error_before_anything_is_allocated():
    data = png(20000, 20000, idat=b"x")  # the DecompressionBombError case
    start = time.perf_counter()
    with pytest.raises(ImageTooLarge, match=r"20000x20000 = 400,000,000 pixels; at most "
                                            r"67,108,864 are accepted"):
        load_pxi(data)
    assert time.perf_counter() - start < 0.5


def test_16_bit_rgba_is_refused_naming_its_bit_depth():
    data = png(4, 4, depth=16)
    with Image.open(io.BytesIO(data)) as im:  # Pillow itself would convert it
        assert im.mode in ("RGBA", "RGBA;16B")
    with pytest.raises(ProgramError, match=r"bit depth 16 and colour type 6 \(RGBA\); a .pxi "
                                           r"program must be RGBA with 8 bits per channel"):
        load_pxi(data)


@pytest.mark.parametrize("depth,colour,kind", [
    (8, 2, "RGB"), (8, 0, "greyscale"), (8, 3, "palette"), (8, 4, "greyscale with alpha"),
    (1, 0, "greyscale"), (16, 2, "RGB"), (8, 5, "colour type 5"),
])
def test_other_formats_are_refused_naming_depth_and_colour_type(depth, colour, kind):
    idat = zlib.compress(bytes(64))
    with pytest.raises(ProgramError, match=rf"bit depth {depth} and colour type {colour} "
                                           rf"\({kind}\)"):
        load_pxi(png(4, 4, depth, colour, idat=idat))


@pytest.mark.parametrize("width,height", [(1, 4), (0, 4), (4, 0), (0, 0)])
def test_dimensions_below_the_protocol_minimum_are_refused(width, height):
    with pytest.raises(ProgramError, match=rf"is {width}x{height} pixels; a .pxi program needs "
                                           "a width of at least 2 and a height of at least 1"):
        load_pxi(png(width, height, idat=b"x"))


def test_a_header_declaring_more_data_than_the_file_can_hold_is_refused():
    # 4000x4000 is under the pixel bound, but 64 MB cannot inflate from a 100-byte file
    data = png(4000, 4000, idat=zlib.compress(b"\0" * 100))
    with pytest.raises(ProgramError, match=r"4000x4000 pixels \(64,004,000 bytes of image "
                                           r"data\) in a file of \d+ bytes, more than deflate "
                                           r"can expand \(1032-fold\)"):
        load_pxi(data)


def test_the_most_compressible_real_png_passes_the_deflate_bound():
    data = pillow_png(np.zeros((4096, 4096, 4), np.uint8))  # ~1029-fold
    header = read_png_header(data)
    assert (header.width, header.height, header.pixels) == (4096, 4096, 1 << 24)
    assert header.raw_bytes > 1000 * len(data)


def test_the_ihdr_must_come_first_with_a_correct_crc():
    good = png(4, 4)
    broken = bytearray(good)
    broken[20] ^= 1  # a bit of the height
    with pytest.raises(ProgramError, match="IHDR chunk's CRC does not match"):
        load_pxi(bytes(broken))
    no_ihdr = b"\x89PNG\r\n\x1a\n" + chunk(b"tEXt", b"a\0b" + bytes(10)) + good[8:]
    with pytest.raises(ProgramError, match=r"first chunk is b'tEXt'"):
        load_pxi(no_ihdr)
    with pytest.raises(ProgramError, match="ends before its IHDR"):
        load_pxi(good[:20])


def adam7(arr) -> bytes:
    """The image data of an interlaced PNG (Pillow writes none): the seven passes' rows,
    each with filter byte 0."""
    passes = [(0, 0, 8, 8), (4, 0, 8, 8), (0, 4, 4, 8), (2, 0, 4, 4), (0, 2, 2, 4),
              (1, 0, 2, 2), (0, 1, 1, 2)]
    out = bytearray()
    for x0, y0, dx, dy in passes:
        sub = arr[y0::dy, x0::dx]
        if sub.size:
            for row in sub:
                out += b"\0" + row.tobytes()
    return zlib.compress(bytes(out))


def test_interlaced_rgba_pngs_load_like_plain_ones():
    arr = np.random.default_rng(0).integers(0, 256, (7, 9, 4), dtype=np.uint8)
    data = png(9, 7, idat=adam7(arr), interlace=1)
    assert read_png_header(data).interlace == 1
    np.testing.assert_array_equal(load_pxi(data), arr)


def test_pillow_decompression_bomb_checks_end_in_a_program_error(monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 100)
    with pytest.raises(ProgramError, match="decompression bomb"):
        load_pxi(png(16, 16))  # 256 pixels: Pillow's error (over twice its limit)
    with pytest.raises(ProgramError, match="decompression bomb"):
        load_pxi(png(15, 10))  # 150 pixels: Pillow's warning, turned into the same error


def test_files_over_the_size_bound_are_not_read(monkeypatch, tmp_path):
    data = pillow_png(np.zeros((4, 4, 4), np.uint8))
    monkeypatch.setattr(pxi_io, "MAX_FILE_BYTES", len(data) - 1)
    with pytest.raises(ProgramError, match=rf"is {len(data):,} bytes; a .pxi file has at most "
                                           rf"{len(data) - 1:,}"):
        load_pxi(data)
    path = tmp_path / "big.pxi"
    path.write_bytes(data)
    with pytest.raises(ProgramError, match=rf"big.pxi is {len(data):,} bytes"):
        load_pxi(path)


def test_the_file_size_bound_holds_the_largest_image_stored_uncompressed():
    # one filter byte per row, the narrowest image (W = 2) having the most rows
    worst_raw = (MAX_PIXELS // 2) * (1 + 4 * 2)
    assert worst_raw + worst_raw // 1000 < pxi_io.MAX_FILE_BYTES


def test_a_caller_may_accept_fewer_pixels():
    data = pillow_png(np.zeros((40, 30, 4), np.uint8))
    assert load_pxi(data, max_pixels=1200).shape == (40, 30, 4)
    with pytest.raises(ImageTooLarge, match=r"30x40 = 1,200 pixels; at most 1,199"):
        load_pxi(data, max_pixels=1199)


@settings(max_examples=60, deadline=None)
@given(width=st.integers(0, 2**32 - 1), height=st.integers(0, 2**32 - 1),
       depth=st.sampled_from([1, 2, 4, 8, 16, 0, 255]), colour=st.integers(0, 255),
       interlace=st.integers(0, 3), body=st.binary(max_size=64))
def test_any_ihdr_ends_in_a_program_error_or_an_image(width, height, depth, colour, interlace, body):
    data = png(width, height, depth, colour, idat=zlib.compress(body), interlace=interlace)
    try:
        img = load_pxi(data)
    except ProgramError as exc:
        assert str(exc)
    else:  # only the format pxVM takes gets through
        assert (depth, colour) == (8, 6) and img.shape == (height, width, 4)
