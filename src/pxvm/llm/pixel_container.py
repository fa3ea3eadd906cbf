"""A GGUF model as pixels: the file's bytes in RGBA PNG images in one folder, lossless
(unpacked, the same file byte for byte) and read back without guessing anything.

Layout of a container folder (format version 1):

    metadata-TTTT.png        the GGUF header (magic, metadata, tensor infos and the
                             padding up to the data), then the bytes between and after
                             the tensors (alignment padding), in file order
    tensors/IIIII-NAME-TTTT.png
                             tensor IIIII's (its place in the file's tensor list) raw
                             bytes, still quantized, tile TTTT

Every image holds a part's bytes in order, 4 a pixel (R, G, B, A), row by row, the last
row's tail zeros; its tEXt chunk "pxvm-pixels" is a JSON header: magic, version, kind
("metadata" or "tensor"), the tensor's name, GGML type, shape (numpy order: rows first)
and byte length, the SHA-256 of all its bytes, and which tile of how many this is. A
tensor's image rows are its rows where they fit (a Q4_K row of 4,096 values, 2,304
bytes, is 576 pixels), so the raw picture keeps the matrix's shape. The metadata's first
tile also holds the file's size and SHA-256. The images are uncompressed: each row of
filter type 0 (None), in stored deflate blocks of whole rows in one IDAT chunk, so a
reader copies the rows out of the file where they lie (any PNG reader decodes them;
other PNGs of the same pixels are read too, through Pillow).

The GGUF header is the authority: it is read by the bounded scan (gguf_scan.py), and
every image's header and size must agree with it, each size read from an image (width,
height, byte length, tile count) bounded before anything is allocated.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
import mmap
import os
import re
import struct
import zlib
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import numpy as np
from PIL import Image, UnidentifiedImageError

from ..core.files import check_regular_file
from .gguf_model import GGUFModelFile
from .gguf_scan import MAX_HEADER_BYTES, GGUFHeader, ModelFileError, TensorInfo, scan
from .pixel_checks import CheckedImages, signature

MAGIC = "pxvm-pixels"
VERSION = 1
#: The PNG text chunk holding an image's JSON header.
TEXT_KEY = "pxvm-pixels"
#: Bytes of one tile at most (4 Mi pixels): a tile is decoded whole, so this bounds what
#: reading one image costs. The tiling (this, the widths) is part of the format: readers
#: expect the tiles a part's size gives, so changing it is a new VERSION.
TILE_BYTES = 1 << 24
#: Image widths at most: a tensor row of more bytes goes in images of WIDTH pixels.
MAX_WIDTH = 8192
#: Image heights at most (a tile of rows of 64 pixels).
MAX_HEIGHT = TILE_BYTES // 4 // 64
#: Width of the images of parts whose rows do not fit MAX_WIDTH or are too short to see.
WIDTH = 1024
#: Rows of fewer pixels are packed WIDTH wide instead (norm vectors, odd shapes).
MIN_ROW_WIDTH = 64
#: Tiles of one part at most (a part of 64 GiB).
MAX_TILES = 4096
#: Bytes of a packed file at most (a bound of the header field: every tile must exist).
MAX_FILE_BYTES = 1 << 50
#: Bytes of an image's JSON header at most.
MAX_HEADER_TEXT = 1 << 16
#: Bytes of a stored deflate block at most (a row of MAX_WIDTH pixels and its filter byte
#: fit in one). Images are stored uncompressed: quantized weights barely compress (5% at
#: zlib level 1, which decodes 5x slower) and a reader copies stored rows out where they
#: lie; a vocabulary, which does compress, is a few MB.
STORED_BLOCK_BYTES = 0xFFFF
#: A zlib stream's first bytes: deflate, a 32 KiB window, no dictionary, level "fastest".
ZLIB_HEADER = b"\x78\x01"
#: Threads decoding a model's images at most.
READ_THREADS = 8
#: A PNG file's first 8 bytes.
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
#: An image's IHDR after its size: 8 bits a sample, RGBA, deflate, filter method 0, not
#: interlaced: the only kind `_PlainPng` reads.
PLAIN_RGBA = (8, 6, 0, 0, 0)
REPACK = "pack the model again (pxvm pixels pack MODEL.gguf -o FOLDER)"


class PixelContainerError(ModelFileError):
    """A pixel container that cannot be read; the message names the image and what to do."""


@dataclass(frozen=True)
class Part:
    """What a container holds in one run of tiles: the metadata or one tensor."""

    kind: str             # "metadata" or "tensor"
    name: str             # the tensor's name ("" for the metadata)
    index: int            # the tensor's place in the file's list (-1 for the metadata)
    qtype: str            # GGML type name ("" for the metadata)
    shape: tuple          # numpy order, rows first (() for the metadata)
    byte_length: int
    row_bytes: int        # bytes of one tensor row (0: the part is not a matrix of rows)

    def tile_path(self, folder: Path, tile: int) -> Path:
        if self.kind == "metadata":
            return folder / f"metadata-{tile:04d}.png"
        safe = re.sub(r"[^A-Za-z0-9._-]", "_", self.name)[:80]
        return folder / "tensors" / f"{self.index:05d}-{safe}-{tile:04d}.png"

    def width(self) -> int:
        """Pixels per image row: one tensor row where it fits, else WIDTH."""
        if self.row_bytes % 4 == 0 and MIN_ROW_WIDTH <= self.row_bytes // 4 <= MAX_WIDTH:
            return self.row_bytes // 4
        return max(1, min(WIDTH, -(-self.byte_length // 4)))

    def tile_length(self) -> int:
        """Bytes a tile holds (the last one fewer): whole image rows of TILE_BYTES at most."""
        row = 4 * self.width()
        return max(row, TILE_BYTES // row * row)

    def tiles(self) -> int:
        return max(1, -(-self.byte_length // self.tile_length()))


def _tensor_part(index: int, t: TensorInfo) -> Part:
    shape = tuple(reversed(t.dims))
    rows = math.prod(shape[:-1]) if shape else 1
    return Part("tensor", t.name, index, t.type_name, shape, t.n_bytes, t.n_bytes // rows)


def _metadata_part(length: int) -> Part:
    return Part("metadata", "", -1, "", (), length, 0)


def _gaps(header: GGUFHeader) -> list[tuple[int, int]]:
    """(start, length) of the bytes after the header that no tensor holds: padding."""
    gaps, at = [], header.data_offset
    for t in sorted(header.tensors.values(), key=lambda t: t.offset):
        if t.offset > at:
            gaps.append((at, t.offset - at))
        at = t.offset + t.n_bytes
    if header.file_size > at:
        gaps.append((at, header.file_size - at))
    return gaps


# ---- writing ---------------------------------------------------------------------------
def _write_tile(path: Path, data: memoryview, part: Part, tile: int, sha256: str,
                extra: dict) -> None:
    width = part.width()
    height = max(1, -(-len(data) // (4 * width)))
    pixels = np.zeros(height * width * 4, np.uint8)
    pixels[:len(data)] = np.frombuffer(data, np.uint8)
    header = {"magic": MAGIC, "version": VERSION, "kind": part.kind, "tensor": part.name,
              "index": part.index, "type": part.qtype, "shape": list(part.shape),
              "byte_length": part.byte_length, "sha256": sha256, "tile": tile,
              "tiles": part.tiles(), "tile_offset": tile * part.tile_length(),
              "tile_bytes": len(data), **extra}
    _write_png(path, pixels.reshape(height, 4 * width), json.dumps(header))


def _write_png(path: Path, rows: np.ndarray, text: str) -> None:
    """An RGBA PNG of `rows` (height x 4 * width bytes), its tEXt chunk TEXT_KEY `text`
    (ASCII JSON), its rows of filter type 0 (None) in stored deflate blocks of whole rows:
    a reader copies them out where they lie (Pillow filters each row and cannot be told
    not to)."""
    height, row_bytes = rows.shape
    scanlines = np.zeros((height, 1 + row_bytes), np.uint8)  # each row after its filter byte
    scanlines[:, 1:] = rows
    with open(path, "wb") as f:
        f.write(PNG_SIGNATURE)
        for kind, body in ((b"IHDR", [struct.pack(">II5B", row_bytes // 4, height, *PLAIN_RGBA)]),
                           (b"tEXt", [f"{TEXT_KEY}\0{text}".encode("latin-1")]),
                           (b"IDAT", _zlib_stored(scanlines)),
                           (b"IEND", [])):
            f.write(struct.pack(">I", sum(len(piece) for piece in body)) + kind)
            crc = zlib.crc32(kind)
            for piece in body:
                f.write(piece)
                crc = zlib.crc32(piece, crc)
            f.write(struct.pack(">I", crc))


def _zlib_stored(scanlines: np.ndarray) -> list[bytes]:
    """A zlib stream of `scanlines` in stored (uncompressed) deflate blocks, each of as
    many whole scanlines as fit in a block, in pieces to write one after the other."""
    height, line = scanlines.shape
    per_block = STORED_BLOCK_BYTES // line
    pieces = [ZLIB_HEADER]
    for first in range(0, height, per_block):
        block = scanlines[first:first + per_block].tobytes()
        last = first + per_block >= height
        pieces += [struct.pack("<BHH", last, len(block), 0xFFFF ^ len(block)), block]
    return pieces + [struct.pack(">I", zlib.adler32(scanlines))]


def _write_part(folder: Path, part: Part, data: memoryview, extra: dict | None = None) -> None:
    sha256 = hashlib.sha256(data).hexdigest()
    step = part.tile_length()
    for tile in range(part.tiles()):
        _write_tile(part.tile_path(folder, tile), data[tile * step:(tile + 1) * step], part,
                    tile, sha256, extra if tile == 0 and extra else {})


def _new_folder(folder: Path) -> None:
    if folder.exists() and (not folder.is_dir() or any(folder.iterdir())):
        raise PixelContainerError(f"{folder} is not an empty folder; pass a new folder for "
                                  "the pixel container (-o)")
    try:
        (folder / "tensors").mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise PixelContainerError(f"cannot create {folder}: {exc.strerror or exc}") from None


def pack(model: str | os.PathLike, folder: str | os.PathLike,
         progress: Callable[[int], None] | None = None) -> GGUFHeader:
    """Write the GGUF file `model` as a pixel container in the new (or empty) `folder`;
    `progress(n)` is told each n bytes written. Returns the file's scanned header. The
    file is read a tile at a time (each tensor twice: its SHA-256 goes in every tile's
    header), so packing holds a few tiles in memory whatever the model's size."""
    path, folder = os.fspath(model), Path(folder)
    check_regular_file(path, ".gguf model", ModelFileError)
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            header = scan(f.read(min(size, MAX_HEADER_BYTES)), path, file_size=size)
            _new_folder(folder)
            file_sha = hashlib.sha256()
            metadata = [_pread(f, 0, header.data_offset, path)]
            file_sha.update(metadata[0])
            index = {name: i for i, name in enumerate(header.tensors)}
            for offset, piece in _layout(header):
                if isinstance(piece, int):  # padding: kept with the header
                    metadata.append(_pread(f, offset, piece, path))
                    file_sha.update(metadata[-1])
                    continue
                _pack_tensor(f, path, folder, _tensor_part(index[piece.name], piece),
                             piece.offset, file_sha)
                _advance(progress, piece.n_bytes)
    except OSError as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc.strerror or exc}") from None
    joined = b"".join(metadata)
    _write_part(folder, _metadata_part(len(joined)), memoryview(joined),
                {"file_bytes": header.file_size, "file_sha256": file_sha.hexdigest()})
    _advance(progress, len(joined))
    # the images hold the bytes just hashed: a first load need not hash them again
    checked = CheckedImages(folder, file_sha.hexdigest())
    for i, t in enumerate(header.tensors.values()):
        checked.add(_signatures(folder, _tensor_part(i, t)))
    checked.save()
    return header


def _signatures(folder: Path, part: Part) -> dict[str, list[int]]:
    paths = (part.tile_path(folder, tile) for tile in range(part.tiles()))
    return {_image_name(folder, path): signature(path.stat()) for path in paths}


def _image_name(folder: Path, path: Path) -> str:
    """An image's name in the container's record of checked images (pixel_checks)."""
    return str(path.relative_to(folder))


def _layout(header: GGUFHeader) -> list[tuple[int, TensorInfo | int]]:
    """(file offset, a tensor or a padding length) after the header, in file order."""
    pieces = [(t.offset, t) for t in header.tensors.values()] + _gaps(header)
    return sorted(pieces, key=lambda piece: piece[0])


def _pread(f, offset: int, n: int, path: str) -> bytes:
    data = os.pread(f.fileno(), n, offset)
    if len(data) != n:
        raise ModelFileError(f"{path} ended at byte {offset + len(data):,} while being "
                             "read; it is truncated: download it again")
    return data


def _pack_tensor(f, path: str, folder: Path, part: Part, offset: int, file_sha) -> None:
    """A tensor's tiles, its bytes read twice: for its SHA-256, then for the images."""
    step = part.tile_length()
    sha = hashlib.sha256()
    for tile in range(part.tiles()):
        at = tile * step
        data = _pread(f, offset + at, min(step, part.byte_length - at), path)
        sha.update(data)
        file_sha.update(data)
    for tile in range(part.tiles()):
        at = tile * step
        data = _pread(f, offset + at, min(step, part.byte_length - at), path)
        _write_tile(part.tile_path(folder, tile), memoryview(data), part, tile,
                    sha.hexdigest(), {})


def _advance(progress, n: int) -> None:
    if progress is not None:
        progress(n)


# ---- reading ---------------------------------------------------------------------------
def _fail(path: Path, problem: str, advice: str = REPACK):
    raise PixelContainerError(f"{path}: {problem}; {advice}")


def _open_image(path: Path):
    """The PNG at `path` (as this packer lays it out, else Pillow's), its size checked
    against the bounds before its pixels are read, and its JSON header."""
    check_regular_file(path, "PNG image", PixelContainerError)
    try:
        image = _PlainPng.open(path) or Image.open(path)
    except FileNotFoundError:
        _fail(path, "is missing from the pixel container")
    except Image.DecompressionBombError as exc:  # Pillow's own bound, far above ours
        _fail(path, f"is over the bounds of an image in a pixel container ({exc})")
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        _fail(path, f"is not a PNG image one can read ({exc})")
    try:
        return image, _checked_header(path, image)
    except PixelContainerError:
        image.close()
        raise


def _checked_header(path: Path, image) -> dict:
    """The image's JSON header, once its format and size are within the bounds."""
    if image.format != "PNG" or image.mode != "RGBA":
        _fail(path, f"is a {image.format} image of mode {image.mode}, not an RGBA PNG")
    width, height = image.size
    if not (1 <= width <= MAX_WIDTH and 1 <= height <= MAX_HEIGHT
            and (height - 1) * width <= TILE_BYTES // 4):
        _fail(path, f"is {width:,} x {height:,} pixels, over the bounds of {MAX_WIDTH:,} x "
                    f"{MAX_HEIGHT:,} and {TILE_BYTES // 4:,} pixels")
    text = image.info.get(TEXT_KEY)  # (image.text would decode the pixels to look further)
    if text is None or len(text) > MAX_HEADER_TEXT:
        _fail(path, f"has no pxvm-pixels header (a tEXt chunk {TEXT_KEY!r} of JSON, at most "
                    f"{MAX_HEADER_TEXT:,} bytes)")
    try:
        meta = json.loads(text)
    except json.JSONDecodeError as exc:
        _fail(path, f"has a pxvm-pixels header that is not JSON ({exc})")
    if not isinstance(meta, dict) or meta.get("magic") != MAGIC:
        _fail(path, f"has no pxvm-pixels magic {MAGIC!r} in its header")
    if meta.get("version") != VERSION:
        _fail(path, f"is of pixel container version {meta.get('version')!r}; this pxvm reads "
                    f"version {VERSION}", "pack the model again with this pxvm")
    return meta


def _integer(path: Path, meta: dict, key: str, low: int, high: int) -> int:
    value = meta.get(key)
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        _fail(path, f"its header's {key!r} is {str(value)[:40]!r}; it must be an integer "
                    f"from {low:,} to {high:,}")
    return value


def _decode_tile(path: Path, image, out: np.ndarray) -> None:
    """The image's first len(out) bytes of pixels into `out`, once its size is checked to
    hold them with less than one row to spare."""
    width, height = image.size
    if not (height - 1) * width * 4 < len(out) <= height * width * 4:
        _fail(path, f"is {width:,} x {height:,} pixels, which does not fit the "
                    f"{len(out):,} bytes its header declares")
    if isinstance(image, _PlainPng):
        image.decode(out)
        return
    try:
        pixels = np.asarray(image, np.uint8)
    except (OSError, ValueError, SyntaxError) as exc:
        _fail(path, f"is truncated or damaged ({exc})")
    out[:] = pixels.reshape(-1)[:len(out)]


class _PlainPng(AbstractContextManager):
    """A PNG laid out as this packer writes it (8-bit RGBA, not interlaced, its rows of
    filter type 0 in stored deflate blocks of whole rows, in one IDAT chunk), mapped, not
    read: its rows are copied out of the page cache's pages where they lie. Its size and
    header are Pillow's attributes (format, mode, size, info)."""

    format, mode = "PNG", "RGBA"

    def __init__(self, size: tuple[int, int], text: str | None, rows: list[np.ndarray],
                 status: os.stat_result):
        self.size, self.info, self._rows = size, {} if text is None else {TEXT_KEY: text}, rows
        self.signature = signature(status)  # of the file as mapped

    @classmethod
    def open(cls, path: Path) -> _PlainPng | None:
        """The image at `path`, its header chunks' CRCs checked (an error naming the image
        where one is wrong); None when it is laid out otherwise, or cut short: Pillow
        reads it."""
        with open(path, "rb") as f:
            status = os.fstat(f.fileno())
            if status.st_size < len(PNG_SIGNATURE):
                return None
            data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        chunks = _png_chunks(data, 8)
        kinds = [kind for kind, _, _ in chunks or []]
        if kinds[:1] != [b"IHDR"] or kinds[-2:] != [b"IDAT", b"IEND"] or kinds.count(b"IDAT") > 1:
            return None
        if len(chunks[0][1]) != 13:
            return None
        width, height, *kind = struct.unpack_from(">II5B", chunks[0][1])
        if tuple(kind) != PLAIN_RGBA:
            return None
        _, body, at = chunks[-2]
        rows = _stored_rows(np.frombuffer(data, np.uint8, len(body), at + 8), width, height)
        if rows is None:  # another layout, or a row of a filter other than None
            return None
        # the pixels' CRC is left to the part's SHA-256, which reads every byte anyway
        # (checking both cost a fifth more) or was found right for this very file (see
        # pixel_checks); where it fails, _name_damaged_tile checks the CRCs
        _check_crcs(path, data, [chunk for chunk in chunks if chunk[0] != b"IDAT"])
        texts = [bytes(body).partition(b"\0") for kind, body, _ in chunks
                 if kind == b"tEXt" and len(body) <= len(TEXT_KEY) + 1 + MAX_HEADER_TEXT]
        text = next((t.decode("latin-1") for key, _, t in texts if key == TEXT_KEY.encode()),
                    None)
        return cls((width, height), text, rows, status)

    def decode(self, out: np.ndarray) -> None:
        """The first len(out) bytes of pixels into `out` (less than a row short of all)."""
        (blocks, per_block, row), last = self._rows[0].shape, self._rows[1][0]
        first = blocks * per_block
        whole, tail = divmod(len(out), row)
        out[:first * row].reshape(blocks, per_block, row)[...] = self._rows[0]
        out[first * row:whole * row].reshape(whole - first, row)[...] = last[:whole - first]
        if tail:
            out[whole * row:] = last[whole - first, :tail]

    def close(self) -> None:
        self._rows = []  # the mapping goes with its last view

    def __exit__(self, *exc) -> None:
        self.close()


def _png_chunks(data: mmap.mmap, most: int) -> list[tuple[bytes, memoryview, int]] | None:
    """(type, body, offset) of each chunk of a PNG of at most `most` chunks, up to its
    IEND; None for any other file."""
    view, at, chunks = memoryview(data), len(PNG_SIGNATURE), []
    if data[:at] != PNG_SIGNATURE:
        return None
    while at + 12 <= len(data) and len(chunks) < most:
        length, kind = struct.unpack_from(">I4s", data, at)
        if at + 12 + length > len(data):
            return None
        chunks.append((kind, view[at + 8:at + 8 + length], at))
        if kind == b"IEND":
            return chunks
        at += 12 + length
    return None


def _check_crcs(path: Path, data: mmap.mmap, chunks: list[tuple[bytes, memoryview, int]]
                ) -> None:
    """An error naming the image where one of `chunks` (of the file `data`) fails its CRC."""
    for kind, body, at in chunks:
        if zlib.crc32(body, zlib.crc32(kind)) != struct.unpack_from(">I", data,
                                                                    at + 8 + len(body))[0]:
            _fail(path, f"is damaged: its {kind.decode('latin-1')!r} chunk at byte {at:,} "
                        "fails its CRC")


def _name_damaged_tile(folder: Path, part: Part) -> None:
    """For a part whose bytes fail their SHA-256: an error naming the first of its images
    with a chunk whose CRC is wrong, where one has."""
    for tile in range(part.tiles()):
        path = part.tile_path(folder, tile)
        try:
            with open(path, "rb") as f:
                data = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            continue  # (changed since it was read) the SHA-256's error names the part
        _check_crcs(path, data, _png_chunks(data, len(data) // 12) or [])


def _stored_rows(stream: np.ndarray, width: int, height: int) -> list[np.ndarray] | None:
    """The scanlines' pixels of a zlib stream laid out as `_zlib_stored` writes it, each
    row of filter type 0, as views (blocks, rows, 4 * width): the blocks before the last,
    then the last; None for a stream laid out otherwise."""
    line = 1 + 4 * width
    if not 1 <= line <= STORED_BLOCK_BYTES or height < 1:
        return None
    per_block = STORED_BLOCK_BYTES // line
    before, rest = divmod(height - 1, per_block)  # the last block holds rest + 1 rows
    if len(stream) != (len(ZLIB_HEADER) + (5 + per_block * line) * before + 5
                       + (rest + 1) * line + 4):
        return None
    at, expected = _framing(width, height)
    if not np.array_equal(stream[at], expected):
        return None
    at, views = len(ZLIB_HEADER), []
    for blocks, rows in ((before, per_block), (1, rest + 1)):
        size = rows * line
        group = stream[at:at + blocks * (5 + size)].reshape(blocks, 5 + size)
        views.append(group[:, 5:].reshape(blocks, rows, line)[:, :, 1:])
        at += blocks * (5 + size)
    return views


@functools.lru_cache(maxsize=256)
def _framing(width: int, height: int) -> tuple[np.ndarray, np.ndarray]:
    """Where `_zlib_stored`'s stream of `height` rows of `width` pixels has bytes other
    than pixels (the zlib header, each stored block's header, each row's filter byte:
    None), and what they are: checked in one comparison."""
    line = 1 + 4 * width
    per_block = STORED_BLOCK_BYTES // line
    at, positions, values = len(ZLIB_HEADER), [np.arange(len(ZLIB_HEADER))], [ZLIB_HEADER]
    for first in range(0, height, per_block):
        rows = min(per_block, height - first)
        size = rows * line
        header = struct.pack("<BHH", first + per_block >= height, size, 0xFFFF ^ size)
        positions += [at + np.arange(5), at + 5 + line * np.arange(rows)]
        values += [header, bytes(rows)]
        at += 5 + size
    return (np.concatenate(positions),
            np.frombuffer(b"".join(values), np.uint8))


def read_tiles(folder: Path, part: Part, out: np.ndarray | None = None,
               checked: CheckedImages | None = None) -> Iterator[tuple[int, np.ndarray]]:
    """(byte offset, bytes) of each of `part`'s tiles in order, each checked against the
    part (header fields, sizes, offsets) and decoded into its place in `out` (the part's
    bytes) or, without `out`, into an array of its own; the SHA-256 of all of them is
    checked after the last, unless `checked` (given with `out`) records every tile as
    checked and unchanged since."""
    digest = hashlib.sha256() if checked is None else None
    expected_sha, at, tiles, images = None, 0, part.tiles(), {}
    for tile in range(tiles):
        path = part.tile_path(folder, tile)
        image, meta = _open_image(path)
        images[_image_name(folder, path)] = getattr(image, "signature", None)
        with image:
            _check_tile(path, meta, part, tile, tiles, at)
            if expected_sha is not None and meta.get("sha256") != expected_sha:
                _fail(path, "its header's 'sha256' differs from the part's first tile's: the "
                            "container is damaged or mixes two models")
            expected_sha = meta["sha256"]
            n = meta["tile_bytes"]
            pixels = np.empty(n, np.uint8) if out is None else out[at:at + n]
            _decode_tile(path, image, pixels)
        if digest is not None:
            digest.update(pixels)
        yield at, pixels
        at += n
    if checked is not None:
        if None not in images.values() and checked.all_unchanged(images):
            return
        digest = hashlib.sha256(out)
    if digest.hexdigest() != expected_sha:
        _name_damaged_tile(folder, part)
        _fail(part.tile_path(folder, 0), f"holds {part.name or 'metadata'} bytes whose SHA-256 "
                                         "is not the one its header records: the images are "
                                         "damaged")
    if checked is not None and None not in images.values():
        checked.add(images)


def _check_tile(path: Path, meta: dict, part: Part, tile: int, tiles: int, at: int) -> None:
    wanted = {"kind": part.kind, "tensor": part.name, "index": part.index, "type": part.qtype,
              "shape": list(part.shape), "byte_length": part.byte_length, "tile": tile,
              "tiles": tiles, "tile_offset": at}
    for key, value in wanted.items():
        if meta.get(key) != value:
            _fail(path, f"its header's {key!r} is {str(meta.get(key))[:60]!r}, but the "
                        f"model's header needs {str(value)[:60]!r} here: the container is "
                        "damaged or mixes two models")
    left = part.byte_length - at
    _integer(path, meta, "tile_bytes", min(1, left), min(left, TILE_BYTES))
    if tile == tiles - 1 and meta["tile_bytes"] != left:
        _fail(path, f"is the last tile but holds {meta['tile_bytes']:,} of the "
                    f"{left:,} bytes left of the part")
    sha = meta.get("sha256")
    if not isinstance(sha, str) or not re.fullmatch(r"[0-9a-f]{64}", sha):
        _fail(path, "its header's 'sha256' is not a SHA-256 in hex")


@dataclass(frozen=True)
class Container:
    """A pixel container opened: its GGUF header (scanned) and its parts."""

    folder: Path
    header: GGUFHeader
    metadata: bytes          # the header bytes and the padding, as packed
    file_sha256: str

    def tensor_parts(self) -> list[Part]:
        return [_tensor_part(i, t) for i, t in enumerate(self.header.tensors.values())]

    def tensor_part(self, name: str) -> Part:
        for part in self.tensor_parts():
            if part.name == name:
                return part
        raise PixelContainerError(f"{self.folder}: the model has no tensor {name!r}")


def is_container(path: str | os.PathLike) -> bool:
    """Whether `path` is a folder (a pixel container, or to be read as one)."""
    return Path(path).is_dir()


def open_container(folder: str | os.PathLike) -> Container:
    """The container in `folder`: its metadata tiles read and checked, the GGUF header
    in them scanned with the file's size as recorded."""
    folder = Path(folder)
    first = _metadata_part(1).tile_path(folder, 0)
    if not first.exists():
        raise PixelContainerError(f"{folder} holds no pixel container ({first.name} is "
                                  f"missing); pass a folder written by pxvm pixels pack")
    image, meta = _open_image(first)
    image.close()
    length = _integer(first, meta, "byte_length", 1, MAX_HEADER_BYTES + TILE_BYTES)
    file_bytes = _integer(first, meta, "file_bytes", 1, MAX_FILE_BYTES)
    file_sha = meta.get("file_sha256")
    if not isinstance(file_sha, str) or not re.fullmatch(r"[0-9a-f]{64}", file_sha):
        _fail(first, "its header's 'file_sha256' is not a SHA-256 in hex")
    part = _metadata_part(length)
    metadata = np.empty(length, np.uint8)
    for _ in read_tiles(folder, part, metadata):
        pass
    header = scan(memoryview(metadata), str(first), file_size=file_bytes)
    gaps = _gaps(header)
    if header.data_offset + sum(n for _, n in gaps) != length:
        _fail(first, f"holds {length:,} bytes of metadata, but the GGUF header in it needs "
                     f"{header.data_offset:,} and {sum(n for _, n in gaps):,} of padding")
    container = Container(folder, header, metadata.tobytes(), file_sha)
    for part in container.tensor_parts():
        _check_tiles_exist(folder, part)
    return container


def _check_tiles_exist(folder: Path, part: Part) -> None:
    """Each of the part's tiles is there, and there are at most MAX_TILES: the header's
    sizes are backed by images before anything of their size is allocated."""
    if part.tiles() > MAX_TILES:
        _fail(part.tile_path(folder, 0), f"starts tensor {part.name!r} of "
                                         f"{part.byte_length:,} bytes: {part.tiles():,} "
                                         f"tiles, over the bound of {MAX_TILES:,}")
    for tile in range(part.tiles()):
        if not part.tile_path(folder, tile).is_file():
            _fail(part.tile_path(folder, tile), "is missing from the pixel container")


def _pieces(container: Container) -> Iterator[tuple[int, Part | bytes]]:
    """(file offset, padding bytes or a tensor's part) in file order, after the header."""
    header, at = container.header, container.header.data_offset
    parts = {p.name: p for p in container.tensor_parts()}
    pieces = [(t.offset, parts[t.name]) for t in header.tensors.values()]
    for start, n in _gaps(header):
        pieces.append((start, container.metadata[at:at + n]))
        at += n
    return iter(sorted(pieces, key=lambda piece: piece[0]))


def unpack(folder: str | os.PathLike, output: str | os.PathLike,
           progress: Callable[[int], None] | None = None) -> Container:
    """Write the GGUF file the container in `folder` holds to `output`, tile by tile;
    PixelContainerError (and no output file) unless its SHA-256 is the one packed."""
    container = open_container(folder)
    output = Path(output)
    partial = output.with_name(output.name + ".partial")
    digest = hashlib.sha256()
    try:
        with open(partial, "wb") as out:
            head = container.metadata[:container.header.data_offset]
            out.write(head)
            digest.update(head)
            _advance(progress, len(head))
            for _, piece in _pieces(container):
                chunks = ([piece] if isinstance(piece, bytes) else
                          (pixels for _, pixels in read_tiles(container.folder, piece)))
                for chunk in chunks:
                    out.write(chunk)
                    digest.update(chunk)
                    _advance(progress, len(chunk))
        if digest.hexdigest() != container.file_sha256:
            _fail(container.folder, "unpacks to a file whose SHA-256 is not the packed one")
        os.replace(partial, output)
    finally:
        partial.unlink(missing_ok=True)
    return container


def read_tensor(container: Container, part: Part) -> np.ndarray:
    """A tensor's raw bytes (uint8), read from its tiles and checked."""
    data = np.empty(part.byte_length, np.uint8)
    for _ in read_tiles(container.folder, part, data):
        pass
    return data


def read_model_file(folder: str | os.PathLike) -> GGUFModelFile:
    """The model in the pixel container `folder`, its bytes rebuilt in memory from the
    images (each tensor's tiles decoded into its place, SHA-256 checked unless unchanged
    since last checked): the same GGUFModelFile, with the same checks, as the packed GGUF
    file gives."""
    container = open_container(folder)
    checked = CheckedImages(container.folder, container.file_sha256)
    data = np.empty(container.header.file_size, np.uint8)
    data[:container.header.data_offset] = np.frombuffer(
        container.metadata, np.uint8, container.header.data_offset)

    def place(piece: tuple[int, Part | bytes]) -> None:
        offset, part = piece
        if isinstance(part, bytes):
            data[offset:offset + len(part)] = np.frombuffer(part, np.uint8)
            return
        for _ in read_tiles(container.folder, part, data[offset:offset + part.byte_length],
                            checked):
            pass

    # copies and SHA-256 run without the GIL: tensors decode on every core
    with ThreadPoolExecutor(max_workers=min(READ_THREADS, os.cpu_count() or 1)) as pool:
        for _ in pool.map(place, _pieces(container)):
            pass
    checked.save()
    return GGUFModelFile.from_bytes(data, os.fspath(folder), container.header)
