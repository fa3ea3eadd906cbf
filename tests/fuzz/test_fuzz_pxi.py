"""Fuzzing .pxi files: valid programs re-encoded as PNG and mutated in their pixels
(opcodes, row arguments, matrix headers), their IHDR fields and their bytes
(pxi_mutations.py), each decoded, validated and run on the CPU executor in the bounded
worker: every case ends in a result or in one clear PxvmError."""

from __future__ import annotations

import numpy as np
from harness import FUZZ, assert_clear, fuzz_worker  # noqa: F401 - the fixture
from hypothesis import given
from hypothesis import strategies as st
from pxi_mutations import encode, mutated_pxi, page_program, vm_program
from vm_targets import load_validate_and_run

from pxvm.vm.protocol import OP_DOT_RGB

KIND = "pxi"


def test_seed_programs_run(fuzz_worker):
    for make in (vm_program, page_program):
        outcome = fuzz_worker.run(load_validate_and_run, encode(make(7)))
        assert outcome.kind == "ok", outcome.message


def test_dot_rgb_over_huge_rows_is_refused_at_once(fuzz_worker):
    # the program: 4096 DOT_RGB over 16.7-million-pixel rows (an hour before v1.2)
    img = np.zeros((4, 1 << 24, 4), np.uint8)
    img[1:3, :, 0] = 1
    img[0, :4096] = (OP_DOT_RGB, 1, 2, 3)
    outcome = fuzz_worker.run(load_validate_and_run, encode(img))
    assert outcome.kind == "error" and "work budget" in outcome.message, outcome.message
    assert outcome.seconds < 10  # decoding 256 MB; the refusal itself is immediate


@FUZZ
@given(data=st.data())
def test_fuzz_pxi_pixels(fuzz_worker, data):
    case = data.draw(mutated_pxi(pixels=4, ihdr=0, byte_level=0))
    assert_clear(fuzz_worker.run(load_validate_and_run, case))


@FUZZ
@given(data=st.data())
def test_fuzz_pxi_header(fuzz_worker, data):
    case = data.draw(mutated_pxi(pixels=1, ihdr=3, byte_level=0))
    assert_clear(fuzz_worker.run(load_validate_and_run, case))


@FUZZ
@given(data=st.data())
def test_fuzz_pxi_bytes(fuzz_worker, data):
    case = data.draw(mutated_pxi(pixels=1, ihdr=1, byte_level=3))
    assert_clear(fuzz_worker.run(load_validate_and_run, case))
