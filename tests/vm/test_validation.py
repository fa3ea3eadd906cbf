"""Malformed programs: one clear ProgramError naming the pixel and the reason, before
anything runs, from both executors; fuzzed images never crash or hang."""

import io

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from PIL import Image

from pxvm.vm import (BudgetExceededError, ProgramError, load_pxi, run_program_cpu,
                     run_program_gpu, validate_program)
from pxvm.vm.assembler import assemble
from programs import random_program


@pytest.mark.parametrize("bad,message", [
    (np.zeros((4, 4, 3), np.uint8), r"shape \(H, W, 4\)"),
    (np.zeros((4, 4, 4), np.float32), "dtype uint8"),
    (np.zeros((0, 4, 4), np.uint8), "empty"),
    ([[1, 2]], "numpy array"),
])
def test_wrong_arrays_are_refused(bad, message):
    with pytest.raises(ProgramError, match=message):
        run_program_cpu(bad)


def test_unknown_opcode_names_the_pixel(gpu_device):
    img = np.zeros((4, 4, 4), np.uint8)
    img[0, 1] = (200, 1, 2, 3)
    img[0, 0] = (3, 1, 0, 0)
    for run in (run_program_cpu, run_program_gpu):
        with pytest.raises(ProgramError, match=r"pixel \(x=1, y=0\).*unknown opcode 200"):
            run(img)


def test_row_out_of_range_names_the_row():
    img = assemble(".size 4 4\nDOT_RGB 1 2 3")
    img[0, 0, 3] = 9
    with pytest.raises(ProgramError, match="row argument 2 is 9, outside the image"):
        validate_program(img)


def test_matmul_shape_mismatch_is_refused():
    img = assemble(".size 8 12\nMATMUL 1 3 6\n.matrix 1 2 3 1 2 3 4 5 6\n.matrix 3 2 2 1 2 3 4")
    with pytest.raises(ProgramError, match=r"shape mismatch: A at row 1 is 2x3 but B at row 3 is 2x2"):
        validate_program(img)


def test_writing_into_the_instruction_row_is_refused():
    with pytest.raises(ProgramError, match="row 0"):
        validate_program(assemble(".size 4 4\nDOT_RGB 1 2 0"))


def test_result_overlapping_its_operand_is_refused():
    img = assemble(".size 8 12\nMATMUL 1 3 1\n.matrix 1 2 2 1 2 3 4\n.matrix 3 2 2 1 2 3 4")
    with pytest.raises(ProgramError, match="overlaps an operand"):
        validate_program(img)


def test_instruction_budget_is_the_same_error_on_both_executors(gpu_device):
    img = np.zeros((2, 5000, 4), np.uint8)
    img[0, :, 0] = 3  # 5000 RELU instructions, no HALT
    for run in (run_program_cpu, run_program_gpu):
        with pytest.raises(BudgetExceededError, match="instruction budget"):
            run(img)


def test_image_larger_than_the_device_allows_is_refused_before_running(gpu_device, monkeypatch):
    monkeypatch.setattr(gpu_device, "max_binding", 4096)  # a device taking 1024 pixels
    img = np.zeros((20, 64, 4), np.uint8)
    with pytest.raises(ProgramError, match="1,280 pixels but this device takes at most 1,024"):
        run_program_gpu(img)


def png_bytes(arr, mode):
    buf = io.BytesIO()
    Image.fromarray(arr, mode).save(buf, format="PNG")
    return buf.getvalue()


def test_files_that_are_not_rgba_pngs_are_refused(tmp_path):
    with pytest.raises(ProgramError, match="not a PNG"):
        load_pxi(b"GIF89a....")
    with pytest.raises(ProgramError, match=r"colour type 2 \(RGB\); a .pxi program must be RGBA"):
        load_pxi(png_bytes(np.zeros((4, 4, 3), np.uint8), "RGB"))
    with pytest.raises(ProgramError, match="damaged PNG"):
        load_pxi(png_bytes(np.zeros((4, 4, 4), np.uint8), "RGBA")[:60])
    with pytest.raises(ProgramError, match="cannot read"):
        load_pxi(tmp_path / "missing.pxi")


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), flips=st.integers(1, 6))
def test_fuzzed_programs_either_run_identically_or_raise_the_documented_error(gpu_device, seed, flips):
    rng = np.random.default_rng(seed)
    img = random_program(seed)
    for _ in range(flips):  # corrupt instruction and header bytes
        y = 0 if rng.random() < 0.7 else int(rng.integers(0, img.shape[0]))
        x = int(rng.integers(0, min(img.shape[1], 8))) if y == 0 else 0
        img[y, x, int(rng.integers(0, 4))] = int(rng.integers(0, 256))
    try:
        cpu = run_program_cpu(img)
    except ProgramError:
        with pytest.raises(ProgramError):
            run_program_gpu(img)
        return
    np.testing.assert_array_equal(cpu, run_program_gpu(img))


@settings(max_examples=40, deadline=None)
@given(data=st.binary(min_size=0, max_size=300))
def test_fuzzed_files_only_raise_program_error(data):
    try:
        load_pxi(b"\x89PNG\r\n\x1a\n" + data)
    except ProgramError:
        pass
