"""Fuzzing GGUF files: valid tiny models (several tensor types) mutated where it hurts
(hostile metadata values and types, array counts, string lengths, tensor dims, types
and offsets, header counts) and byte by byte (flips, inserts, deletes, truncation,
mostly in the header), each opened, loaded on numpy and run for two tokens in the
bounded worker: every case ends in a result or in one clear PxvmError."""

from __future__ import annotations

import math
import struct
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest
from gguf_target import open_load_and_run
from harness import FUZZ, assert_clear, fuzz_worker, mutate_bytes  # noqa: F401 - the fixture
from hypothesis import given
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from gguf_layout import SCALARS, Layout, layout, put
from make_tiny_gguf import TinySpec, write_tiny_gguf

KIND = "gguf"

#: Seeds: small enough that a case (write, scan, load, forward) takes milliseconds.
SEED_SPECS = {
    "q4_1": TinySpec(),
    "f16_f32_untied": TinySpec(n_layers=1, dim=32, n_heads=2, n_kv_heads=1, ffn_dim=64,
                               vocab_size=40, matrix_type="F16", embedding_type="F32",
                               tied_output=False),
    "mixed": TinySpec(n_layers=1, dim=64, n_heads=4, n_kv_heads=4, ffn_dim=64, vocab_size=50,
                      matrix_type="Q4_0", embedding_type="Q8_0",
                      matrix_types={"attn_v": "Q8_0", "ffn_down": "F16"}),
    "k_quants": TinySpec(n_layers=1, dim=256, n_heads=4, n_kv_heads=2, ffn_dim=256,
                         vocab_size=32, matrix_type="Q4_K", embedding_type="Q8_0",
                         matrix_types={"attn_v": "Q6_K", "ffn_down": "Q6_K"}),
}

HOSTILE_INTS = [0, 1, 2, 3, -1, -(2**31), 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**40,
                2**63 - 1, 2**63, 2**64 - 1, 7, 63, 255, 4096]
HOSTILE_FLOATS = [math.nan, math.inf, -math.inf, 0.0, -0.0, -1.0, 1.0, 0.5, 1e30, -1e30,
                  1e-30, 1e-45, 3.4e38]
# every GGML type number that exists, some removed (4, 5) and some past the end
GGML_TYPES = list(range(45)) + [2**31, 2**32 - 1]


@dataclass
class Seed:
    name: str
    data: bytes
    layout: Layout


@pytest.fixture(scope="module")
def seeds(tmp_path_factory) -> list[Seed]:
    folder = tmp_path_factory.mktemp("gguf-seeds")
    made = []
    for i, (name, spec) in enumerate(SEED_SPECS.items()):
        path = folder / f"{name}.gguf"
        write_tiny_gguf(path, spec, np.random.default_rng(i))
        data = path.read_bytes()
        made.append(Seed(name, data, layout(data)))
    return made


def _int_like(draw, near: int | None = None) -> int:
    choices = [st.sampled_from(HOSTILE_INTS), st.integers(-(2**63), 2**64 - 1)]
    if near is not None:
        choices.append(st.sampled_from([near - 1, near + 1, near * 2, near // 2, near + 32]))
    return draw(st.one_of(choices))


# ---- structured mutations: each draws a field of the seed's layout and a hostile value ---
def _metadata_value(draw, data: bytearray, lay: Layout) -> None:
    scalars = [kv for kv in lay.keys.values() if kv.value_type in SCALARS]
    kv = draw(st.sampled_from(scalars))
    fmt = SCALARS[kv.value_type]
    if fmt in ("<f", "<d"):
        value = draw(st.one_of(st.sampled_from(HOSTILE_FLOATS), st.floats(width=32)))
    elif fmt == "<?":
        value = draw(st.booleans())
    else:
        value = _int_like(draw)
    put(data, kv.value_at, fmt, value)


def _metadata_type(draw, data: bytearray, lay: Layout) -> None:
    kv = draw(st.sampled_from(list(lay.keys.values())))
    put(data, kv.type_at, "<I", draw(st.one_of(st.integers(0, 14), st.just(2**32 - 1))))


def _array_count(draw, data: bytearray, lay: Layout) -> None:
    kv = draw(st.sampled_from([kv for kv in lay.keys.values() if kv.count_at is not None]))
    count = np.frombuffer(bytes(data[kv.count_at:kv.count_at + 8]), "<u8")[0]
    put(data, kv.count_at, "<Q", _int_like(draw, int(count)))


def _string_length(draw, data: bytearray, lay: Layout) -> None:
    places = [kv.key_length_at for kv in lay.keys.values()]
    for kv in lay.keys.values():
        places += kv.string_lengths_at[:3] + kv.string_lengths_at[-1:]
    at = draw(st.sampled_from(places))
    length = int(np.frombuffer(bytes(data[at:at + 8]), "<u8")[0])
    put(data, at, "<Q", _int_like(draw, length))


def _tensor_dim(draw, data: bytearray, lay: Layout) -> None:
    t = draw(st.sampled_from(list(lay.tensors.values())))
    axis = draw(st.integers(0, len(t.dims) - 1))
    put(data, t.dims_at[axis], "<Q", _int_like(draw, t.dims[axis]))


def _tensor_dim_count(draw, data: bytearray, lay: Layout) -> None:
    t = draw(st.sampled_from(list(lay.tensors.values())))
    put(data, t.n_dims_at, "<I", draw(st.sampled_from([0, 1, 2, 3, 4, 5, 2**32 - 1])))


def _tensor_type(draw, data: bytearray, lay: Layout) -> None:
    t = draw(st.sampled_from(list(lay.tensors.values())))
    put(data, t.type_at, "<I", draw(st.sampled_from(GGML_TYPES)))


def _tensor_offset(draw, data: bytearray, lay: Layout) -> None:
    t = draw(st.sampled_from(list(lay.tensors.values())))
    others = [u.offset for u in lay.tensors.values()]
    value = draw(st.one_of(st.sampled_from([t.offset + 1, t.offset + 32, t.offset - 32, 0,
                                            2**64 - 1, 2**63]),
                           st.sampled_from(others), st.integers(0, 2**64 - 1)))
    put(data, t.offset_at, "<Q", value)


def _header_count(draw, data: bytearray, lay: Layout) -> None:
    at = draw(st.sampled_from([4, 8, 16]))  # version, tensor count, metadata count
    put(data, at, "<I" if at == 4 else "<Q", _int_like(draw, 3 if at == 4 else 20))


STRUCTURED = [_metadata_value, _metadata_value, _metadata_type, _array_count, _string_length,
              _tensor_dim, _tensor_dim, _tensor_dim_count, _tensor_type, _tensor_offset,
              _header_count]


# ---- byte mutations, most aimed at the header ---------------------------------------------
def _position(draw, size: int, header_end: int) -> int:
    """A byte position: in the first 24 bytes (magic, version, counts), the header or
    anywhere, uniformly within the region (hypothesis's integers favour the ends)."""
    region = draw(st.sampled_from([header_end, size, header_end, header_end, 24]))
    return draw(st.randoms(use_true_random=False)).randrange(max(1, min(region, size)))


def _bytes_mutated(draw, data: bytearray, lay: Layout) -> bytearray:
    if not data:
        return data
    return mutate_bytes(draw, data, _position(draw, len(data), lay.header_end))


@st.composite
def mutated(draw, seeds: list[Seed], structured: int, byte_level: int) -> bytes:
    """A seed with up to `structured` field mutations, then up to `byte_level` byte ones
    (after, since they move the fields); at least one in all."""
    seed = draw(st.sampled_from(seeds))
    data = bytearray(seed.data)
    n_fields = draw(st.integers(0 if byte_level else 1, structured))
    n_bytes = draw(st.integers(0 if n_fields else 1, byte_level))
    for _ in range(n_fields):
        draw(st.sampled_from(STRUCTURED))(draw, data, seed.layout)
    for _ in range(n_bytes):
        data = _bytes_mutated(draw, data, seed.layout)
    return bytes(data)


def test_seeds_load_and_run(fuzz_worker, seeds):
    for seed in seeds:
        outcome = fuzz_worker.run(open_load_and_run, seed.data)
        assert outcome.kind == "ok", f"{seed.name}: {outcome.message}"


def test_huge_array_header_is_refused_at_once(fuzz_worker):
    # the 49-byte file: an array of 2^40 UINT8 (it grew past 3 GB before)
    data = (b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a"
            + struct.pack("<IIQ", 9, 0, 2**40))
    outcome = fuzz_worker.run(open_load_and_run, data)
    assert outcome.kind == "error" and f"{2**40:,}" in outcome.message, outcome.message
    assert outcome.seconds < 1.0


@FUZZ
@given(data=st.data())
def test_fuzz_gguf_fields(fuzz_worker, seeds, data):
    case = data.draw(mutated(seeds, structured=3, byte_level=0))
    assert_clear(fuzz_worker.run(open_load_and_run, case))


@FUZZ
@given(data=st.data())
def test_fuzz_gguf_bytes(fuzz_worker, seeds, data):
    case = data.draw(mutated(seeds, structured=1, byte_level=3))
    assert_clear(fuzz_worker.run(open_load_and_run, case))
