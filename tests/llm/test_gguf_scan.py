"""The bounded GGUF header scan (pxvm.llm.gguf_scan) on hand-built byte strings: every
field read as written, and each count, length, type, dimension and offset out of bounds
refused with a message naming the field, its value and the bound."""

from __future__ import annotations

import struct
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFValueType
from make_tiny_gguf import TinySpec, write_tiny_gguf

from pxvm.llm import ModelFileError, default_model_path, gguf_scan
from pxvm.llm.gguf_scan import scan

U8, I8, U16, I16, U32, I32, F32, BOOL, STR, ARR, U64, I64, F64 = range(13)
F32_T, F16_T, Q4_0_T, Q8_0_T, Q4_K_T = 0, 1, 2, 8, 12


def u32(v):
    return struct.pack("<I", v)


def u64(v):
    return struct.pack("<Q", v)


def string(text) -> bytes:
    data = text.encode() if isinstance(text, str) else text
    return u64(len(data)) + data


def kv(key, vtype, payload: bytes) -> bytes:
    return string(key) + u32(vtype) + payload


def array(element_type, items: list[bytes]) -> bytes:
    return u32(element_type) + u64(len(items)) + b"".join(items)


def tensor(name, dims, ggml_type, offset) -> bytes:
    return (string(name) + u32(len(dims)) + b"".join(u64(d) for d in dims)
            + u32(ggml_type) + u64(offset))


def gguf(kvs=(), tensors=(), data=b"", version=3, n_tensors=None, n_keys=None,
         alignment=32) -> bytes:
    """A GGUF file: header, padding to `alignment`, then `data`."""
    head = (b"GGUF" + u32(version) + u64(len(tensors) if n_tensors is None else n_tensors)
            + u64(len(kvs) if n_keys is None else n_keys) + b"".join(kvs) + b"".join(tensors))
    return head + bytes(-len(head) % alignment) + data


def refused(data: bytes, *words):
    with pytest.raises(ModelFileError) as info:
        scan(data, "t.gguf")
    message = str(info.value)
    assert message.startswith("t.gguf: ") and "\n" not in message
    for word in words:
        assert word in message, message
    return message


# ---- what a valid header holds -----------------------------------------------------------
def test_empty_header():
    header = scan(gguf(), "t.gguf")
    assert (header.version, header.metadata, header.tensors) == (3, {}, {})
    assert (header.alignment, header.data_offset, header.file_size) == (32, 32, 32)


def test_version_2_is_read():
    assert scan(gguf(version=2), "t.gguf").version == 2


def test_every_scalar_type():
    scalars = [(U8, "<B", 200), (I8, "<b", -5), (U16, "<H", 60000), (I16, "<h", -300),
               (U32, "<I", 4_000_000_000), (I32, "<i", -7), (F32, "<f", 1.5),
               (BOOL, "<?", True), (U64, "<Q", 2**63 + 1), (I64, "<q", -(2**40)),
               (F64, "<d", 0.1)]
    header = scan(gguf([kv(f"k{t}", t, struct.pack(f, v)) for t, f, v in scalars]), "t.gguf")
    for t, _, v in scalars:
        assert header.metadata[f"k{t}"] == v
        assert header.value_types[f"k{t}"] == (t,)


def test_strings_and_arrays():
    header = scan(gguf([
        kv("name", STR, string("héllo")),
        kv("bad utf8", STR, string(b"a\xffb")),
        kv("ints", ARR, array(I32, [struct.pack("<i", v) for v in (1, -2, 3)])),
        kv("flags", ARR, array(BOOL, [b"\x00", b"\x02"])),
        kv("words", ARR, array(STR, [string("a"), string(""), string("ccc"), string(b"\xff")])),
        kv("nested", ARR, array(ARR, [array(U8, [b"\x01", b"\x02"]), array(U8, [])])),
        kv("empty", ARR, array(F32, [])),
    ]), "t.gguf")
    m = header.metadata
    assert m["name"] == "héllo" and m["bad utf8"] == "a\ufffdb"
    assert m["ints"] == [1, -2, 3] and m["flags"] == [False, True]
    assert m["words"] == ["a", "", "ccc", "\ufffd"]
    assert m["nested"] == [[1, 2], []] and m["empty"] == []
    assert header.value_types["words"] == (ARR, STR)
    assert header.value_types["nested"] == (ARR, ARR, U8)


def test_tensors_and_their_data_offsets():
    data = bytes(range(256)) * 2
    header = scan(gguf(tensors=[tensor("a", [4, 2], F32_T, 0),
                                tensor("b", [32], Q8_0_T, 64),
                                tensor("c", [3], F16_T, 128)], data=data), "t.gguf")
    start = header.data_offset
    assert start % 32 == 0 and header.file_size == start + len(data)
    a, b, c = header.tensors.values()
    assert (a.name, a.dims, a.ggml_type, a.offset, a.n_bytes) == ("a", (4, 2), 0, start, 32)
    assert (b.dims, b.offset, b.n_bytes, b.type_name) == ((32,), start + 64, 34, "Q8_0")
    assert (c.offset, c.n_bytes) == (start + 128, 6)


def test_custom_alignment():
    align = kv("general.alignment", U32, u32(256))
    header = scan(gguf([align], [tensor("a", [4], F32_T, 256)], data=bytes(272),
                       alignment=256), "t.gguf")
    assert header.alignment == 256 and header.data_offset == 256
    assert header.tensors["a"].offset == 512


# ---- the header ------------------------------------------------------------------------
def test_not_gguf():
    refused(b"GGML" + bytes(40), "not a GGUF file", "GGML")


@pytest.mark.parametrize("version", [0, 1, 4, 2**32 - 1])
def test_unsupported_version(version):
    refused(gguf(version=version), f"GGUF version {version:,}", "versions 2 and 3")


def test_big_endian_file():
    refused(b"GGUF" + struct.pack(">I", 3) + bytes(16), "big-endian")


def test_every_truncation_of_a_header_is_refused():
    data = gguf([kv("general.architecture", STR, string("llama")),
                 kv("v", ARR, array(U32, [u32(1), u32(2)]))],
                [tensor("a", [4], F32_T, 0)], data=bytes(16))
    scan(data, "t.gguf")
    for end in range(len(data)):
        refused(data[:end], "truncated")


def test_tensor_count_over_bound():
    refused(gguf(n_tensors=2**64 - 1), f"declares {2**64 - 1:,} tensors",
            f"bound of {gguf_scan.MAX_TENSORS:,}")


def test_tensor_count_over_the_bytes_left():
    refused(gguf(n_tensors=1000), "declares 1,000 tensors", "8 bytes are left", "truncated")


def test_key_count_over_bound():
    refused(gguf(n_keys=2**40), f"declares {2**40:,} metadata keys",
            f"bound of {gguf_scan.MAX_KEYS:,}")


def test_key_count_over_the_bytes_left():
    refused(gguf(n_keys=100), "declares 100 metadata keys", "8 bytes are left", "truncated")


# ---- metadata --------------------------------------------------------------------------
def test_the_49_byte_file_declaring_2_to_the_40_elements_fails_fast():
    data = b"GGUF" + u32(3) + u64(0) + u64(1) + string("a") + u32(ARR) + u32(U8) + u64(2**40)
    assert len(data) == 49
    tracemalloc.start()
    t0 = time.perf_counter()
    message = refused(data, f"metadata 'a' is an array of {2**40:,} UINT8 elements",
                      f"bound of {gguf_scan.MAX_ARRAY_LENGTH:,}")
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seconds < 0.1, seconds
    assert peak < 256 << 10, peak
    assert message.startswith("t.gguf: metadata 'a'")


def test_array_longer_than_the_bytes_left():
    data = gguf([kv("v", ARR, u32(U32) + u64(1000) + u32(7))])
    refused(data, "metadata 'v' is an array of 1,000 UINT32 elements", "bytes are left")


def test_string_array_longer_than_the_bytes_left():
    refused(gguf([kv("t", ARR, u32(STR) + u64(100_000))]), "metadata 't'",
            "100,000 STRING elements of at least 8 bytes")


def test_all_arrays_together_over_bound(monkeypatch):
    monkeypatch.setattr(gguf_scan, "MAX_METADATA_VALUES", 10)
    six = array(U8, [b"\x00"] * 6)
    scan(gguf([kv("a", ARR, six)]), "t.gguf")
    refused(gguf([kv("a", ARR, six), kv("b", ARR, six)]), "metadata 'b'", "12",
            "bound of 10")


def test_header_bytes_over_bound(monkeypatch):
    monkeypatch.setattr(gguf_scan, "MAX_HEADER_BYTES", 64)
    refused(gguf([kv("s", STR, string("x" * 100))]), "header is over the bound of 64")


def test_key_length_over_bound():
    data = b"GGUF" + u32(3) + u64(0) + u64(1) + u64(2**64 - 1) + bytes(20)
    refused(data, "metadata key #0", f"{2**64 - 1:,}", f"bound of {gguf_scan.MAX_KEY_BYTES:,}")


def test_key_longer_than_the_file():
    data = b"GGUF" + u32(3) + u64(0) + u64(1) + u64(1000) + b"abc" + bytes(20)
    refused(data, "metadata key #0", "1,000 bytes", "truncated")


def test_key_not_utf8():
    refused(gguf([kv(b"\xff\xfe", U8, b"\x01")]), "metadata key #0", "not valid UTF-8")


def test_string_value_over_bound():
    data = gguf([kv("chat", STR, u64(2**62))])
    refused(data, "metadata 'chat'", f"{2**62:,}", f"bound of {gguf_scan.MAX_STRING_BYTES:,}")


def test_string_value_longer_than_the_file():
    refused(gguf([kv("chat", STR, u64(5000) + b"{% if %}")]), "metadata 'chat'",
            "5,000 bytes", "truncated")


def test_string_in_array_longer_than_the_file():
    refused(gguf([kv("t", ARR, array(STR, [string("a"), u64(10**6)]))]),
            "metadata 't'[1]", "truncated")


def test_string_in_array_over_bound():
    refused(gguf([kv("t", ARR, array(STR, [string("a"), u64(2**62) + bytes(8)]))]),
            "metadata 't'[1]", f"{2**62:,} bytes", f"bound of {gguf_scan.MAX_STRING_BYTES:,}")


def test_duplicate_key():
    refused(gguf([kv("k", U8, b"\x01"), kv("k", U8, b"\x02")]), "'k' appears twice")


@pytest.mark.parametrize("vtype", [13, 255, 2**32 - 1])
def test_unknown_value_type(vtype):
    refused(gguf([kv("k", vtype, bytes(8))]), "metadata 'k'", f"value type {vtype}")


def test_unknown_array_element_type():
    refused(gguf([kv("k", ARR, u32(77) + u64(1) + bytes(8))]), "metadata 'k'",
            "value type 77")


def test_arrays_nested_two_levels():
    inner = array(ARR, [array(U8, [b"\x01"])])
    refused(gguf([kv("k", ARR, array(ARR, [inner]))]), "metadata 'k'", "more than one level")


@pytest.mark.parametrize("alignment", [0, 3, 48, 1 << 20])
def test_bad_alignment(alignment):
    refused(gguf([kv("general.alignment", U32, u32(alignment))]), "'general.alignment'",
            f"{alignment:,}", "power of two", f"{gguf_scan.MAX_ALIGNMENT:,}")


def test_alignment_of_the_wrong_type():
    refused(gguf([kv("general.alignment", U64, u64(32))]), "'general.alignment'", "UINT64",
            "not UINT32")


# ---- tensor infos ----------------------------------------------------------------------
def test_tensor_name_over_bound():
    refused(gguf(tensors=[tensor("x" * 300, [4], F32_T, 0)], data=bytes(16)),
            "the name of tensor #0", "300 bytes", f"bound of {gguf_scan.MAX_TENSOR_NAME_BYTES}")


def test_duplicate_tensor():
    refused(gguf(tensors=[tensor("a", [4], F32_T, 0), tensor("a", [4], F32_T, 32)],
                 data=bytes(48)), "tensor 'a' appears twice")


def test_too_many_dimensions():
    data = gguf(tensors=[string("a") + u32(5) + u64(1) * 5 + u32(F32_T) + u64(0)],
                data=bytes(4))
    refused(data, "tensor 'a'", "5 dimensions", "bound of 4")


def test_dimension_count_that_runs_past_the_file():
    refused(gguf(tensors=[string("a") + u32(2**32 - 1)]), "tensor 'a'", "4,294,967,295",
            "bound of 4")


def test_zero_dimension():
    refused(gguf(tensors=[tensor("w", [64, 0], F32_T, 0)]), "tensor 'w'",
            "dimension 1 of size 0", "at least 1")


def test_element_count_overflow():
    refused(gguf(tensors=[tensor("w", [2**32, 2**32], F32_T, 0)]), "tensor 'w'",
            f"{2**64:,} elements", f"bound of {2**63 - 1:,}")


@pytest.mark.parametrize("code", [4, 5, 99, 2**32 - 1])
def test_unknown_ggml_type(code):
    refused(gguf(tensors=[tensor("w", [32], code, 0)], data=bytes(64)), "tensor 'w'",
            f"GGML type {code}", "does not exist")


@pytest.mark.parametrize("row, qtype, block", [(16, Q8_0_T, 32), (128, Q4_K_T, 256),
                                               (33, Q4_0_T, 32)])
def test_rows_not_a_whole_number_of_blocks(row, qtype, block):
    refused(gguf(tensors=[tensor("w", [row, 2], qtype, 0)], data=bytes(1024)), "tensor 'w'",
            f"rows of {row} values", f"block of {block}")


def test_misaligned_tensor_offset():
    refused(gguf(tensors=[tensor("w", [4], F32_T, 4)], data=bytes(64)), "tensor 'w'",
            "data offset 4", "alignment 32")


def test_misaligned_under_a_custom_alignment():
    align = kv("general.alignment", U32, u32(64))
    refused(gguf([align], [tensor("w", [4], F32_T, 32)], data=bytes(64), alignment=64),
            "tensor 'w'", "data offset 32", "alignment 64")


def test_tensor_data_past_the_end():
    refused(gguf(tensors=[tensor("w", [64, 64], F32_T, 0)], data=bytes(1000)), "tensor 'w'",
            "F32", "[64, 64]", "past the end of the file", "truncated")


def test_tensor_offset_far_past_the_end():
    refused(gguf(tensors=[tensor("w", [4], F32_T, 2**64 - 32)], data=bytes(16)),
            "tensor 'w'", "past the end of the file")


def test_overlapping_tensors():
    refused(gguf(tensors=[tensor("a", [16], F32_T, 0), tensor("b", [16], F32_T, 32)],
                 data=bytes(128)), "tensor 'b'", "overlaps tensor 'a'")


def test_scan_time_grows_with_the_file_only():
    # a header of 100,000 strings is read in well under a second (a real vocabulary's size)
    words = kv("t", ARR, array(STR, [string(f"w{i}") for i in range(100_000)]))
    t0 = time.perf_counter()
    header = scan(gguf([words]), "t.gguf")
    assert len(header.metadata["t"]) == 100_000 and header.metadata["t"][-1] == "w99999"
    assert time.perf_counter() - t0 < 1.0


# ---- against the gguf package's own reader -----------------------------------------------
def _reader_view(path):
    """Metadata, tensor infos and tensor bytes as gguf.GGUFReader reads them."""
    reader = GGUFReader(str(path))
    metadata = {}
    for name, f in reader.fields.items():
        if name.startswith("GGUF."):
            continue
        if f.types[0] == GGUFValueType.ARRAY:
            metadata[name] = f.contents()
        elif f.types[0] == GGUFValueType.STRING:
            metadata[name] = bytes(f.parts[f.data[0]]).decode("utf-8")
        else:
            metadata[name] = f.parts[f.data[0]].tolist()[0]
    tensors = {t.name: (tuple(int(d) for d in t.shape), int(t.tensor_type), t.data_offset,
                        int(t.n_bytes), np.asarray(t.data).tobytes()) for t in reader.tensors}
    return metadata, tensors


def _scan_view(path):
    data = path.read_bytes()
    header = scan(data, str(path))
    tensors = {t.name: (t.dims, t.ggml_type, t.offset, t.n_bytes,
                        data[t.offset:t.offset + t.n_bytes]) for t in header.tensors.values()}
    return header.metadata, tensors


@pytest.mark.parametrize("spec", [
    TinySpec(),
    TinySpec(n_layers=1, matrix_type="F16", embedding_type="F32", tied_output=False),
    TinySpec(n_layers=1, dim=256, ffn_dim=256, vocab_size=20, matrix_type="Q4_K",
             matrix_types={"attn_v": "Q6_K", "ffn_down": "Q4_0"}),
], ids=["q4_1", "f16_f32", "k_quants"])
def test_reads_what_the_gguf_reader_reads(tmp_path, rng, spec):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, spec, rng)
    assert _scan_view(path) == _reader_view(path)


def test_reads_the_default_model_as_the_gguf_reader_does():
    try:
        path = Path(default_model_path())
    except ModelFileError:
        pytest.skip("the default model is not installed")
    metadata, tensors = _scan_view(path)
    expected_metadata, expected_tensors = _reader_view(path)
    assert metadata == expected_metadata
    assert tensors.keys() == expected_tensors.keys()
    for name, (dims, qtype, offset, n_bytes, _) in tensors.items():
        assert (dims, qtype, offset, n_bytes) == expected_tensors[name][:4], name
