"""Assembler and disassembler: exact round trips and clear errors."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pxvm.vm.assembler import AssemblyError, assemble, disassemble
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
