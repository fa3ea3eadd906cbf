"""Test support: where each field of a valid GGUF file lies, read plainly with struct
(independently of pxvm's scanner), so tests can patch a metadata value, an array count,
a string length or a tensor's dims, type or offset in place, and fuzzers can aim at them."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

# GGUF value type -> struct format of a scalar
SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?",
           10: "<Q", 11: "<q", 12: "<d"}
STRING, ARRAY = 8, 9


@dataclass
class KeyValue:
    key: str
    key_length_at: int      # the key's u64 length
    type_at: int            # the value type u32
    value_type: int
    value_at: int           # a scalar's bytes, a string's u64 length, an array's element type
    element_type: int | None = None     # arrays
    count_at: int | None = None         # arrays: the u64 element count
    string_lengths_at: list = field(default_factory=list)  # u64 lengths of string values


@dataclass
class TensorField:
    name: str
    n_dims_at: int
    dims_at: list           # the u64 dims, row length first
    dims: list
    type_at: int
    ggml_type: int
    offset_at: int
    offset: int             # relative to the data section


@dataclass
class Layout:
    keys: dict              # key -> KeyValue
    tensors: dict           # name -> TensorField
    header_end: int         # the end of the tensor infos (before the data's padding)


def _string(data: bytes, at: int) -> tuple[str, int]:
    (n,) = struct.unpack_from("<Q", data, at)
    return data[at + 8:at + 8 + n].decode("utf-8"), at + 8 + n


def _skip_value(data: bytes, at: int, vtype: int, kv: KeyValue) -> int:
    if vtype in SCALARS:
        return at + struct.calcsize(SCALARS[vtype])
    if vtype == STRING:
        kv.string_lengths_at.append(at)
        return _string(data, at)[1]
    element, count = struct.unpack_from("<IQ", data, at)
    if kv.element_type is None:
        kv.element_type, kv.count_at = element, at + 4
    at += 12
    for _ in range(count):
        at = _skip_value(data, at, element, kv)
    return at


def layout(data: bytes) -> Layout:
    assert data[:4] == b"GGUF"
    n_tensors, n_keys = struct.unpack_from("<QQ", data, 8)
    at, keys, tensors = 24, {}, {}
    for _ in range(n_keys):
        key_at = at
        key, at = _string(data, at)
        (vtype,) = struct.unpack_from("<I", data, at)
        kv = KeyValue(key, key_at, at, vtype, at + 4)
        at = _skip_value(data, at + 4, vtype, kv)
        keys[key] = kv
    for _ in range(n_tensors):
        name, at = _string(data, at)
        (n_dims,) = struct.unpack_from("<I", data, at)
        dims_at = [at + 4 + 8 * i for i in range(n_dims)]
        dims = [struct.unpack_from("<Q", data, a)[0] for a in dims_at]
        type_at = at + 4 + 8 * n_dims
        ggml_type, offset = struct.unpack_from("<IQ", data, type_at)
        tensors[name] = TensorField(name, at, dims_at, dims, type_at, ggml_type, type_at + 4,
                                    offset)
        at = type_at + 12
    return Layout(keys, tensors, at)


def put(data: bytearray, at: int, fmt: str, value) -> None:
    """Write `value` as `fmt` at `at`, wrapping integers to the field's width."""
    if fmt[-1] in "BbHhIiQq":
        bits = 8 * struct.calcsize(fmt)
        value = int(value) % (1 << bits)
        if fmt[-1].islower() and value >= 1 << (bits - 1):
            value -= 1 << bits
    struct.pack_into(fmt, data, at, value)


def set_scalar(data: bytearray, lay: Layout, key: str, value) -> None:
    """Overwrite metadata `key`'s scalar value in place (in its own type and width)."""
    kv = lay.keys[key]
    put(data, kv.value_at, SCALARS[kv.value_type], value)
