"""Fuzzing pxVM assembly: programs drawn from a grammar of the directives and instructions
of the text form (docs/pixel-protocol.md, section 6), with hostile numbers (huge, negative,
past every field's range, non-integers, other spellings) and junk tokens, each assembled
and run on the CPU executor in the bounded worker: every case ends in a result or in one
clear PxvmError (an AssemblyError names the line)."""

from __future__ import annotations

from harness import FUZZ, assert_clear, fuzz_worker  # noqa: F401 - the fixture
from hypothesis import given
from hypothesis import strategies as st
from vm_targets import assemble_and_run

from pxvm.vm.protocol import OPCODES

KIND = "assembly"

# every field's bounds and just past them, other spellings of integers, and non-integers
HOSTILE_NUMBERS = [
    "0", "1", "2", "-1", "127", "128", "-128", "-129", "255", "256", "65535", "65536",
    "2147483647", "2147483648", "-2147483648", "-2147483649", "4294967295", "4294967296",
    str(2**63), str(-(2**63) - 1), str(10**30), "9" * 5000, "0x10", "0xff", "0b101", "0o17",
    "1_000", "+5", "-0", "010", "1.5", "1e3", "nan", "inf", "-inf", "0x", "--1", "1-", "٣",
    "１２", "\u00b2", "", "None",
]
JUNK = ['"', "'", '"1 2', "\\", "\x00", "\x7f", "é", "\U0001f642", ".", "#", "[", "{", ",", "=",
        "ROWHI", "dot_rgb", "Halt", "x" * 300, "\u200b", "\r", "\x0b", "\x0c"]
MNEMONICS = sorted(OPCODES) + ["dot_rgb", "Matmul_I8", "NOP", "JMP", "ROWHI", "HALT!", "."]
DIRECTIVES = [".vector", ".matrix", ".matrix32", ".requant", ".pixel", ".row", ".size",
              ".VECTOR", ".data", "."]

small = st.integers(0, 24).map(str)
hostile_number = st.one_of(small, st.integers(-300, 300).map(str), st.sampled_from(HOSTILE_NUMBERS))
hostile_token = st.one_of(hostile_number, hostile_number, st.sampled_from(JUNK))


@st.composite
def instruction(draw, number, token) -> str:
    name = draw(st.sampled_from(MNEMONICS))
    args = draw(st.lists(st.one_of(number, number, number, token), max_size=4))
    return " ".join([name, *args])


@st.composite
def matrix(draw, number, token) -> str:
    head = draw(st.sampled_from([".matrix", ".matrix32"]))
    rows, cols = draw(st.integers(1, 6)), draw(st.integers(1, 6))
    sizes = draw(st.one_of(st.just([str(rows), str(cols)]), st.lists(number, min_size=2,
                                                                      max_size=2)))
    count = draw(st.one_of(st.just(rows * cols), st.integers(0, 40)))
    value = st.one_of(st.integers(-128, 127).map(str), number, token)
    values = draw(st.lists(value, min_size=count, max_size=count))
    return " ".join([head, draw(number), *sizes, *values])


@st.composite
def directive(draw, number, token) -> str:
    head = draw(st.sampled_from(DIRECTIVES))
    if head == ".row":
        pixels = draw(st.lists(st.binary(min_size=4, max_size=4).map(bytes.hex), max_size=12))
        rest = [draw(number), *pixels, *draw(st.lists(token, max_size=1))]
    elif head == ".requant":
        rest = draw(st.lists(number, min_size=3, max_size=5))
    elif head == ".pixel":
        rest = draw(st.lists(number, min_size=5, max_size=7))
    else:
        rest = draw(st.lists(st.one_of(number, number, token), max_size=30))
    return " ".join([head, *rest])


@st.composite
def program(draw) -> str:
    """A .size line and up to 20 lines; in a well-formed program the numbers are small and
    rows mostly inside the image, in a hostile one anything goes."""
    hostile = draw(st.booleans())
    number = hostile_number if hostile else small
    token = hostile_token if hostile else small
    size = draw(st.sampled_from([f".size {draw(st.integers(2, 40))} {draw(st.integers(1, 40))}"]
                                * 6 + [f".size {draw(number)} {draw(number)}",
                                       f".size {draw(number)}", ""]))
    line = st.one_of(instruction(number, token), instruction(number, token),
                     matrix(number, token), directive(number, token),
                     st.sampled_from(["", "; a comment", "HALT", "   \t  ", "DOT_RGB 1 2 3 ; note"]),
                     st.lists(token, max_size=5).map(" ".join))
    lines = draw(st.lists(line, max_size=20))
    separator = draw(st.sampled_from(["\n", "\n", "\r\n", "\t\n", "\n\n"]))
    return separator.join([size, *lines])


def test_valid_programs_assemble_and_run(fuzz_worker):
    source = ("; a v1.0 dot product and an int8 layer\n.size 8 12\nDOT_RGB 1 2 3\n"
              "MATMUL_I8 4 5 6\nREQUANT 6 8 9\nHALT\n.vector 1 1 2 3 4\n.vector 2 10 20 30 40\n"
              ".matrix 4 2 3 1 -2 3 -4 5 -6\n.matrix 5 3 2 7 8 -9 10 11 12\n.requant 8 1000 4 -3")
    outcome = fuzz_worker.run(assemble_and_run, source)
    assert outcome.kind == "ok", outcome.message


def test_out_of_range_vector_value_is_refused(fuzz_worker):
    outcome = fuzz_worker.run(assemble_and_run, ".size 4 4\n.vector 1 300")
    assert outcome.kind == "error" and "line 2" in outcome.message and "300" in outcome.message


@FUZZ
@given(source=program())
def test_fuzz_assembly(fuzz_worker, source):
    assert_clear(fuzz_worker.run(assemble_and_run, source))


@FUZZ
@given(source=st.text(max_size=400))
def test_fuzz_assembly_text(fuzz_worker, source):
    assert_clear(fuzz_worker.run(assemble_and_run, ".size 8 8\n" + source))
