"""Assembler and disassembler: exact round trips and clear errors."""

import time
import tracemalloc

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pxvm.vm.assembler import AssemblyError, assemble, disassemble, disassembly_lines
from programs import random_program


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_disassembly_assembles_back_to_the_same_bytes(seed):
    img = random_program(seed)
    np.testing.assert_array_equal(assemble(disassemble(img)), img)


@settings(max_examples=40, deadline=None)
@given(st.integers(2, 40), st.integers(1, 40), st.integers(0, 2**32 - 1))
def test_arbitrary_images_round_trip(w, h, seed):
    img = np.random.default_rng(seed).integers(0, 256, (h, w, 4), dtype=np.uint8)
    np.testing.assert_array_equal(assemble(disassemble(img)), img)


def test_rows_past_255_get_a_rowhi_prefix():
    img = assemble(".size 4 600\nDOT_RGB 599 300 2")
    assert img[0, 0].tolist() == [10, 2, 1, 0] and img[0, 1].tolist() == [1, 87, 44, 2]


@pytest.mark.parametrize("src,message", [
    ("DOT_RGB 1 2 3", "must start with `.size"),
    (".size 4 4\nFLY 1 2", "unknown instruction 'FLY'"),
    (".size 4 4\nDOT_RGB 1 x 3", "must be integers"),
    (".size 4 4\n.matrix 1 2 2 1 2 3", "needs 4 values, got 3"),
    (".size 2 2\nRELU 1\nRELU 1\nRELU 1", "row 0 is full"),
])
def test_bad_source_names_the_line(src, message):
    with pytest.raises(AssemblyError, match=message):
        assemble(src)


def test_vector_300_is_refused_instead_of_wrapping():
    with pytest.raises(AssemblyError, match=r"line 2: .vector value 300 is outside its range 0..255"):
        assemble(".size 4 4\n.vector 1 1 300 2")


@pytest.mark.parametrize("line,message", [
    (".vector 1 -1", r".vector value -1 is outside its range 0..255"),
    (".matrix 1 1 2 5 256", r".matrix value 256 is outside its range -128..255"),
    (".matrix 1 1 2 -129 0", r".matrix value -129 is outside its range -128..255"),
    (".matrix 1 0 2", r".matrix row count 0 is outside its range 1..65535"),
    (".matrix 1 2 65536", r".matrix column count 65536 is outside its range 1..65535"),
    (".matrix32 1 1 2 2147483648 0", r".matrix32 value 2147483648 is outside its range "
                                     r"-2147483648..2147483647"),
    (".matrix32 1 1 1 -2147483649", r".matrix32 value -2147483649 is outside"),
    (".requant 2 65536 0 0", r".requant multiplier 65536 is outside its range 0..65535"),
    (".requant 2 -1 0 0", r".requant multiplier -1 is outside its range 0..65535"),
    (".requant 2 1 32 0", r".requant shift 32 is outside its range 0..31"),
    (".requant 2 1 3 128", r".requant zero point 128 is outside its range -128..127"),
    (".requant 2 1 3 -129", r".requant zero point -129 is outside its range -128..127"),
    (".pixel 1 1 0 0 256 0", r".pixel channel value 256 is outside its range 0..255"),
    (".pixel 9 1 0 0 0 0", r".pixel column 9 is outside its range 0..7"),
    ("DOT_RGB 1 2 65536", r"DOT_RGB row argument 3 65536 is outside its range 0..65535"),
    ("DOT_RGB -1 2 3", r"DOT_RGB row argument 1 -1 is outside its range 0..65535"),
    ("RELU 1 256", r"RELU argument 2 256 is outside its range 0..255"),
    ("ROWHI 256 0 0", r"ROWHI argument 1 256 is outside its range 0..255"),
    ("HALT 0 0 -5", r"HALT argument 3 -5 is outside its range 0..255"),
])
def test_every_value_outside_its_field_is_refused_naming_line_value_and_range(line, message):
    with pytest.raises(AssemblyError, match="line 2: " + message):
        assemble(".size 8 8\n" + line)


def test_the_ends_of_every_range_assemble_exactly():
    img = assemble(".size 8 8\nDOT_RGB 1 2 3\n.vector 1 0 255\n.matrix 2 1 2 -128 255\n"
                   ".matrix32 3 1 2 -2147483648 2147483647\n.requant 5 65535 31 -128\n"
                   ".pixel 7 6 255 0 255 0")
    assert img[1, :2, 0].tolist() == [0, 255]
    assert img[2, 1:3, 0].tolist() == [128, 255]
    assert img[3, 1:3].view("<i4").ravel().tolist() == [-2**31, 2**31 - 1]
    assert img[5, 1].view("<u4")[0] == 65535 and img[5, 2, :2].tolist() == [31, 128]
    assert img[6, 7].tolist() == [255, 0, 255, 0]


@pytest.mark.parametrize("src,message", [
    (".size 65535 65535", r"line 1: .size 65535 65535 is 4,294,836,225 pixels; a program has "
                          r"at most 67,108,864"),
    (".size 1 4", r".size width 1 is outside its range 2..65535"),
    (".size 4 0", r".size height 0 is outside its range 1..65535"),
    (".size 4", r".size takes 2 values, got 1"),
    (".size 4 4\nDOT_RGB 1.5 2 3", r"DOT_RGB arguments must be integers, got '1.5'"),
    (".size 4 4\nDOT_RGB nan 2 3", r"must be integers, got 'nan'"),
    (".size 4 4\nDOT_RGB \"1 2 3", r"must be integers, got '\"1'"),
    (".size 4 4\nDOT_RGB " + "9" * 5000 + " 2 3", r"DOT_RGB arguments: .9999.* has 5,000 characters"),
    (".size 4 4\nDOT_RGB 1 2 3 4", r"DOT_RGB takes at most 3 values here"),
    (".size 4 4\n.vector", r".vector needs a row number"),
    (".size 4 4\n.row", r".row needs a row number"),
    (".size 4 4\n.matrix 1 2", r".matrix needs ROW ROWS COLS and the values"),
    (".size 4 4\n.matrix 1 100 100 1", r".matrix 100x100 at row 1 needs image rows up to 3334"),
    (".size 4 4\n.requant 1 2 3", r".requant \(row, multiplier, shift, zero point\) takes 4 "
                                  r"values, got 3"),
    (".size 2 4\n.requant 1 2 3 0", r".requant writes pixels 1 and 2 of its row; the image is "
                                    r"2 wide"),
    (".size 4 4\n.nope 1", r"unknown directive '.nope'"),
])
def test_malformed_lines_are_assembly_errors(src, message):
    with pytest.raises(AssemblyError, match=message):
        assemble(src)


def test_a_line_carrying_more_values_than_its_item_can_place_is_refused_unsplit():
    many = " 1" * 3_000_000  # 6 MB of values for a row of 8 pixels
    for line in (".vector 1" + many, ".matrix 1 2 2" + many, ".row 1" + many):
        start = time.perf_counter()
        with pytest.raises(AssemblyError, match=r"line 2: .* takes at most \d+ values here; the "
                                                "line has more"):
            assemble(".size 8 8\n" + line)
        assert time.perf_counter() - start < 0.5  # not split into 3 million tokens


@pytest.mark.parametrize("literal", ["0x" + "f" * 5000, "9" * 5000, "0b" + "1" * 100_000,
                                     "-0x" + "0" * 10_000 + "1"])
def test_a_huge_integer_literal_is_one_short_error(literal):
    with pytest.raises(AssemblyError) as caught:
        assemble(f".size 4 4\nDOT_RGB {literal} 2 3\n")
    message = str(caught.value)
    assert message.startswith("line 2: DOT_RGB arguments: ") and len(message) < 200
    assert f"has {len(literal):,} characters; a value here has at most 64" in message


def test_a_large_image_is_disassembled_in_bounded_memory():
    import tracemalloc

    img = np.random.default_rng(1).integers(0, 256, (2048, 2048, 4), dtype=np.uint8)
    text_bytes = 2 * img.nbytes  # its .row lines, in hex
    tracemalloc.start()
    try:
        written = sum(len(line) + 1 for line in disassembly_lines(img))
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert written > text_bytes
    assert peak < text_bytes / 16  # a row's text at a time, not the whole
    small = img[:64, :64].copy()
    assert "".join(line + "\n" for line in disassembly_lines(small)) == disassemble(small)


def matrix_source(head: str, values: np.ndarray, width: int, height: int) -> str:
    """`values` as a matrix of 1000-value rows at image row 1."""
    return (f".size {width} {height}\n{head} 1 {values.size // 1000} 1000 "
            + " ".join(map(str, values.tolist())) + "\n")


@pytest.mark.parametrize("head,lo,hi", [(".matrix", -128, 255),
                                        (".matrix32", -(2**31), 2**31 - 1)])
def test_a_matrix_line_of_megabytes_places_every_value(head, lo, hi):
    values = np.random.default_rng(3).integers(lo, hi, 300_000, endpoint=True)
    img = assemble(matrix_source(head, values, 1001, 400))
    # the protocol's layout: header at (0, 1), element i at (1 + i % 1000, 1 + i // 1000)
    assert img[1, 0].tolist() == [1000 & 255, 1000 >> 8, 300 & 255, 300 >> 8]  # cols, rows
    elements = img[1:301, 1:].reshape(-1, 4)
    if head == ".matrix":
        np.testing.assert_array_equal(elements[:, 0], (values & 255).astype(np.uint8))
        assert not elements[:, 1:].any()
    else:
        np.testing.assert_array_equal(elements.copy().view("<i4")[:, 0], values)


def test_a_bad_value_deep_in_a_long_matrix_line_is_named_by_its_number():
    values = [str(v % 200) for v in range(600_000)]
    values[500_000] = "x"
    with pytest.raises(AssemblyError, match=r"line 2: \.matrix values must be integers, got "
                                            r"'x' \(value 500001\)"):
        assemble(".size 1001 700\n.matrix 1 600 1000 " + " ".join(values))
    values[500_000] = "256"
    with pytest.raises(AssemblyError, match=r"line 2: \.matrix value 256 is outside its range "
                                            r"-128\.\.255 \(value 500001\)"):
        assemble(".size 1001 700\n.matrix 1 600 1000 " + " ".join(values))


def test_a_matrix_costs_memory_per_character_not_a_python_object_per_value():
    """Peak memory while assembling two matrices into the same image: the extra values
    cost a few bytes each (copies of the text), not the ~100 of a token and an int."""
    values = np.random.default_rng(4).integers(-128, 256, 520_000)
    peaks = []
    for n in (130_000, 520_000):
        source = matrix_source(".matrix", values[:n], 1001, 530)
        tracemalloc.start()
        assemble(source)
        peaks.append(tracemalloc.get_traced_memory()[1])
        tracemalloc.stop()
    assert (peaks[1] - peaks[0]) / 390_000 < 32
