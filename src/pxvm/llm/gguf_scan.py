"""A bounded scan of a GGUF file's header: magic, version, every metadata key and value,
every tensor's name, shape, type and data range, each count and length checked against
a sane bound and against the bytes left in the file before anything is allocated or
iterated. A file that passes holds nothing that would make reading it grow without
bound: the largest things it can make are its own bytes.

The `gguf` package's reader walks every array element in Python before checking
anything (a 49-byte file declaring 2^40 elements grows for ever), so pxvm reads the
header here and never hands the file to it.

Layout (little-endian; GGUF versions 2 and 3):
    "GGUF", version u32, tensor count u64, metadata count u64,
    metadata: key (string), value type u32, value,
    tensor infos: name (string), n_dims u32, dims u64 x n_dims (row length first),
                  GGML type u32, data offset u64 (from the data section),
    padding to `general.alignment`, tensor data.
A string is a u64 length and that many UTF-8 bytes; an array is an element type u32, a
count u64 and the elements.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass

import numpy as np
from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType, GGUFValueType

from ..core.errors import PxvmError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32

# Bounds. Each is far above what real models carry (Llama 3 70B: 723 tensors, 80 layers;
# Llama 3.1 405B: 1,138 tensors; vocabularies up to ~262k tokens (Gemma 3), merge lists
# up to ~450k; chat templates of tens of KB; headers under 10 MB), so that every model
# people run passes, while a crafted header is stopped before it costs more than a few
# hundred MB or a few seconds.
#: Tensors in one file.
MAX_TENSORS = 1 << 16
#: Metadata keys in one file (real files carry 20 to 60).
MAX_KEYS = 1 << 16
#: Bytes of a metadata key (the GGUF specification's own limit).
MAX_KEY_BYTES = (1 << 16) - 1
#: Bytes of a tensor name (ggml's GGML_MAX_NAME is 64).
MAX_TENSOR_NAME_BYTES = 256
#: Bytes of one string value (chat templates are the longest: tens of KB).
MAX_STRING_BYTES = 1 << 24
#: Elements of one array (the vocabulary and merge lists are the longest).
MAX_ARRAY_LENGTH = 1 << 21
#: Elements of all arrays together (Gemma 3's tokens, scores and types: ~790k).
MAX_METADATA_VALUES = 1 << 22
#: Bytes before the tensor data (the header of a 262k-token vocabulary is under 10 MB).
MAX_HEADER_BYTES = 1 << 26
#: Dimensions of one tensor (ggml's GGML_MAX_DIMS).
MAX_DIMS = 4
#: general.alignment (files use 32, the default; a power of two up to this).
MAX_ALIGNMENT = 1 << 16
#: ggml counts elements in int64.
MAX_ELEMENTS = (1 << 63) - 1

# value type -> struct format of one scalar (little-endian)
_SCALARS = {
    GGUFValueType.UINT8: "<B", GGUFValueType.INT8: "<b", GGUFValueType.UINT16: "<H",
    GGUFValueType.INT16: "<h", GGUFValueType.UINT32: "<I", GGUFValueType.INT32: "<i",
    GGUFValueType.FLOAT32: "<f", GGUFValueType.BOOL: "<?", GGUFValueType.UINT64: "<Q",
    GGUFValueType.INT64: "<q", GGUFValueType.FLOAT64: "<d",
}
_U64 = struct.Struct("<Q")
_STRING_HEAD = 8               # a string's u64 length
_ARRAY_HEAD = 4 + 8            # an array's element type and count
_SMALLEST_KEY_VALUE = 8 + 4 + 1    # an empty key, the value type, a one-byte value
_SMALLEST_TENSOR_INFO = 8 + 4 + 4 + 8  # an empty name, n_dims 0, type, offset


class ModelFileError(PxvmError):
    """A GGUF file that cannot be used; the message says what is wrong and what to do."""


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dims: tuple      # GGUF order: the row length (ne0) first
    ggml_type: int
    offset: int      # of its first byte in the file
    n_bytes: int

    @property
    def type_name(self) -> str:
        return GGMLQuantizationType(self.ggml_type).name


@dataclass(frozen=True)
class GGUFHeader:
    version: int
    metadata: dict      # key -> int, float, bool, str, or a list of them (or of lists)
    value_types: dict   # key -> (GGUFValueType,), arrays (ARRAY, element type, ..)
    tensors: dict       # name -> TensorInfo, in file order
    alignment: int
    data_offset: int    # where the tensor data section starts
    file_size: int


def _type_name(code: int) -> str:
    try:
        return GGUFValueType(code).name
    except ValueError:
        return str(code)


class _Scanner:
    """Reads the header of `buf` front to back, checking before each step."""

    def __init__(self, buf, where: str):
        self.buf = buf
        self.where = where
        self.end = len(buf)
        self.pos = 0
        self.values = 0  # array elements read so far (MAX_METADATA_VALUES)

    def fail(self, message: str):
        raise ModelFileError(f"{self.where}: {message}")

    def left(self) -> int:
        return self.end - self.pos

    def take(self, n: int, what: str) -> int:
        """Advance over n bytes (of `what`); returns where they start."""
        if n > self.left():
            self.fail(f"{what} needs {n:,} bytes at byte {self.pos:,}, but only "
                      f"{self.left():,} are left: the file is truncated or damaged; "
                      "download it again")
        if self.pos + n > MAX_HEADER_BYTES:
            self.fail(f"{what} ends past byte {self.pos + n:,}: the GGUF header is over the "
                      f"bound of {MAX_HEADER_BYTES:,} bytes")
        start = self.pos
        self.pos += n
        return start

    def scalar(self, fmt: str, what: str):
        return struct.unpack_from(fmt, self.buf, self.take(struct.calcsize(fmt), what))[0]

    def raw_string(self, what: str, bound: int) -> bytes:
        n = self.scalar("<Q", f"the length of {what}")
        if n > bound:
            self.fail(f"{what} has a length of {n:,} bytes, over the bound of {bound:,}")
        start = self.take(n, what)
        return bytes(self.buf[start:start + n])

    def name(self, what: str, bound: int) -> str:
        """A key or tensor name: strict UTF-8, as ggml reads them."""
        at = self.pos
        data = self.raw_string(what, bound)
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            self.fail(f"{what} at byte {at:,} is not valid UTF-8 ({data[:40]!r})")

    def count_fits(self, count: int, smallest: int, subject: str, items: str,
                   bound: int) -> None:
        """`count` items of at least `smallest` bytes each: within `bound` and within the
        bytes left, checked before any of them is read. `subject` says whose count it
        is ("the header declares"), `items` what they are ("tensors")."""
        if count > bound:
            self.fail(f"{subject} {count:,} {items}, over the bound of {bound:,}")
        if count * smallest > self.left():
            self.fail(f"{subject} {count:,} {items} of at least {smallest} bytes each, "
                      f"but only {self.left():,} bytes are left in the file: it is "
                      "truncated or damaged; download it again")

    # ---- metadata ---------------------------------------------------------------------
    def value(self, code: int, key: str, depth: int = 0):
        """One value of GGUF value type `code`; returns (value, types)."""
        fmt = _SCALARS.get(code)
        if fmt is not None:
            return self.scalar(fmt, f"metadata {key!r}"), (GGUFValueType(code),)
        if code == GGUFValueType.STRING:
            data = self.raw_string(f"metadata {key!r}", MAX_STRING_BYTES)
            return data.decode("utf-8", errors="replace"), (GGUFValueType.STRING,)
        if code == GGUFValueType.ARRAY:
            return self.array(key, depth)
        self.fail(f"metadata {key!r} has value type {code}, which GGUF does not define")

    def array(self, key: str, depth: int):
        what = f"metadata {key!r}"
        element = self.scalar("<I", f"the element type of {what}")
        if element == GGUFValueType.ARRAY and depth >= 1:
            self.fail(f"{what} nests arrays more than one level deep")
        if element not in _SCALARS and element not in (GGUFValueType.STRING,
                                                       GGUFValueType.ARRAY):
            self.fail(f"{what} is an array of value type {element}, which GGUF does not "
                      "define")
        count = self.scalar("<Q", f"the element count of {what}")
        smallest = (struct.calcsize(_SCALARS[element]) if element in _SCALARS
                    else _STRING_HEAD if element == GGUFValueType.STRING else _ARRAY_HEAD)
        self.count_fits(count, smallest, f"{what} is an array of",
                        f"{_type_name(element)} elements", MAX_ARRAY_LENGTH)
        if self.values + count > MAX_METADATA_VALUES:
            self.fail(f"{what} brings the header's array elements to "
                      f"{self.values + count:,}, over the bound of {MAX_METADATA_VALUES:,}")
        self.values += count
        types = (GGUFValueType.ARRAY, GGUFValueType(element))
        if element in _SCALARS:
            return self.numbers(element, count, what), types
        if element == GGUFValueType.STRING:
            return self.strings(count, what), types
        items = [self.array(key, depth + 1) for _ in range(count)]
        inner = items[0][1][1:] if items else ()
        return [value for value, _ in items], types + inner

    def strings(self, count: int, what: str) -> list:
        """`count` string values: raw_string's checks, in a loop of its own since
        vocabularies are hundreds of thousands of strings."""
        buf, pos, unpack = self.buf, self.pos, _U64.unpack_from
        end = min(self.end, MAX_HEADER_BYTES)
        out = []
        for i in range(count):
            if pos + 8 <= end:
                (n,) = unpack(buf, pos)
                if n <= MAX_STRING_BYTES and pos + 8 + n <= end:
                    out.append(str(buf[pos + 8:pos + 8 + n], "utf-8", "replace"))
                    pos += 8 + n
                    continue
            self.pos = pos
            self.raw_string(f"{what}[{i}]", MAX_STRING_BYTES)  # raises the error it is
        self.pos = pos
        return out

    def numbers(self, element: int, count: int, what: str) -> list:
        fmt = _SCALARS[element]
        size = struct.calcsize(fmt)
        start = self.take(count * size, what)
        if element == GGUFValueType.BOOL:
            raw = np.frombuffer(self.buf, np.uint8, count, start)
            return (raw != 0).tolist()
        return np.frombuffer(self.buf, np.dtype(fmt), count, start).tolist()

    def metadata(self, count: int):
        values, types = {}, {}
        for index in range(count):
            at = self.pos
            key = self.name(f"metadata key #{index}", MAX_KEY_BYTES)
            if key in values:
                self.fail(f"metadata key {key!r} appears twice (again at byte {at:,})")
            code = self.scalar("<I", f"the value type of metadata {key!r}")
            values[key], types[key] = self.value(code, key)
        return values, types

    # ---- tensors ----------------------------------------------------------------------
    def tensor_info(self, index: int, names: set):
        name = self.name(f"the name of tensor #{index}", MAX_TENSOR_NAME_BYTES)
        what = f"tensor {name!r}"
        if name in names:
            self.fail(f"{what} appears twice")
        names.add(name)
        n_dims = self.scalar("<I", f"the dimension count of {what}")
        if n_dims > MAX_DIMS:
            self.fail(f"{what} has {n_dims:,} dimensions, over the bound of {MAX_DIMS}")
        dims = tuple(self.scalar("<Q", f"the dimensions of {what}") for _ in range(n_dims))
        for axis, size in enumerate(dims):
            if size < 1:
                self.fail(f"{what} has dimension {axis} of size {size}; every dimension "
                          "must be at least 1")
        elements = math.prod(dims)
        if elements > MAX_ELEMENTS:
            self.fail(f"{what} has dims {list(dims)}: {elements:,} elements, over the bound "
                      f"of {MAX_ELEMENTS:,}")
        code = self.scalar("<I", f"the GGML type of {what}")
        try:
            ggml = GGMLQuantizationType(code)
            block, block_bytes = GGML_QUANT_SIZES[ggml]
        except (ValueError, KeyError):
            self.fail(f"{what} has GGML type {code}, which does not exist")
        row = dims[0] if dims else 1
        if row % block:
            self.fail(f"{what} has rows of {row:,} values, not a multiple of {ggml.name}'s "
                      f"block of {block}")
        offset = self.scalar("<Q", f"the data offset of {what}")
        return name, dims, code, offset, elements // block * block_bytes


def _alignment(values: dict, types: dict, fail) -> int:
    if "general.alignment" not in values:
        return DEFAULT_ALIGNMENT
    alignment = values["general.alignment"]
    if types["general.alignment"] != (GGUFValueType.UINT32,):
        fail(f"metadata 'general.alignment' is of type "
             f"{'/'.join(t.name for t in types['general.alignment'])}, not UINT32")
    if alignment < 1 or alignment > MAX_ALIGNMENT or alignment & (alignment - 1):
        fail(f"metadata 'general.alignment' is {alignment:,}; it must be a power of two "
             f"from 1 to {MAX_ALIGNMENT:,}")
    return alignment


def _check_placement(tensors: dict, alignment: int, data_offset: int, size: int,
                     fail) -> None:
    """Each tensor aligned, inside the file, and apart from the others (llama.cpp
    requires them one after another, so no real file has them overlap)."""
    for t in tensors.values():
        relative = t.offset - data_offset
        if relative % alignment:
            fail(f"tensor {t.name!r} has data offset {relative:,}, not a multiple of the "
                 f"alignment {alignment}")
        if t.offset + t.n_bytes > size:
            fail(f"tensor {t.name!r} ({t.type_name}, dims {list(t.dims)}) needs bytes "
                 f"{t.offset:,}..{t.offset + t.n_bytes:,}, past the end of the file at "
                 f"{size:,}: the file is truncated or damaged; download it again")
    previous = None
    for t in sorted(tensors.values(), key=lambda t: t.offset):
        if previous is not None and t.offset < previous.offset + previous.n_bytes:
            fail(f"tensor {t.name!r} (bytes {t.offset:,}..{t.offset + t.n_bytes:,}) "
                 f"overlaps tensor {previous.name!r} (bytes {previous.offset:,}.."
                 f"{previous.offset + previous.n_bytes:,})")
        previous = t


def _version(s: _Scanner) -> int:
    version = s.scalar("<I", "the GGUF version")
    if version not in SUPPORTED_VERSIONS:
        if version & 0xFFFF == 0 and (version >> 24) in SUPPORTED_VERSIONS:
            s.fail("is a big-endian GGUF file, which pxvm does not read; use a "
                   "little-endian one")
        s.fail(f"has GGUF version {version:,}; pxvm reads versions "
               f"{' and '.join(map(str, SUPPORTED_VERSIONS))}")
    return version


def scan(buf, where: str, file_size: int | None = None) -> GGUFHeader:
    """The header of the GGUF file whose bytes are `buf` (bytes, a memoryview or a
    memory map); ModelFileError naming the field, its value and the bound at the first
    thing out of bounds. `where` names the file in messages. `file_size` is the whole
    file's size where `buf` holds only its beginning (a pixel container's header)."""
    s = _Scanner(buf, where)
    magic = bytes(buf[s.take(4, "the GGUF magic"):4])
    if magic != GGUF_MAGIC:
        s.fail(f"is not a GGUF file (it starts with {magic!r}, not b'GGUF'); pass a .gguf "
               "model")
    version = _version(s)
    n_tensors = s.scalar("<Q", "the tensor count")
    n_keys = s.scalar("<Q", "the metadata count")
    s.count_fits(n_keys, _SMALLEST_KEY_VALUE, "the header declares", "metadata keys",
                 MAX_KEYS)
    s.count_fits(n_tensors, _SMALLEST_TENSOR_INFO, "the header declares", "tensors",
                 MAX_TENSORS)
    values, types = s.metadata(n_keys)
    alignment = _alignment(values, types, s.fail)
    names: set = set()
    infos = [s.tensor_info(i, names) for i in range(n_tensors)]
    data_offset = -(-s.pos // alignment) * alignment
    tensors = {name: TensorInfo(name, dims, code, data_offset + offset, n_bytes)
               for name, dims, code, offset, n_bytes in infos}
    size = s.end if file_size is None else file_size
    _check_placement(tensors, alignment, data_offset, size, s.fail)
    return GGUFHeader(version, values, types, tensors, alignment, data_offset, size)
