"""pxVM executors: the v1.0 contract, hand-checked opcode semantics (expected values
worked out from docs/pixel-protocol.md, not from our executors), and random programs
that must run byte-identically on the CPU and the GPU."""

from importlib import resources

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from pxvm.vm import load_pxi, run_program_cpu, run_program_gpu
from pxvm.vm.assembler import assemble
from programs import random_program


def both(img):
    cpu = run_program_cpu(img)
    gpu = run_program_gpu(img)
    np.testing.assert_array_equal(cpu, gpu)
    return cpu


def test_v1_dot_test_leaves_300_at_pixel_0_3(gpu_device):
    img = load_pxi(resources.files("pxvm.examples").joinpath("dot_test.pxi").read_bytes())
    assert img.shape == (16, 16, 4)
    out = both(img)
    assert tuple(out[3, 0, :2]) == (44, 1)  # 300 = 1 * 256 + 44
    changed = np.argwhere(np.any(out != img, axis=2))
    assert changed.tolist() == [[3, 0]]  # nothing else was touched


def test_dot_length_stops_at_the_first_column_where_both_rows_are_zero(gpu_device):
    img = assemble(".size 8 5\nDOT_RGB 1 2 3\n.vector 1 0 2 9 9\n.vector 2 5 0 0 0 7")
    img[1, 3], img[2, 3] = 0, 0  # column 3: both all-zero -> length 3
    out = both(img)
    # columns 0..2: 0*5 + 2*0 + 9*0 = 0; the 9 at column 3 is excluded... column 3 of row 1
    # was cleared above, so the vectors end there.
    assert tuple(out[3, 0, :2]) == (0, 0)
    img[2, 2, 0] = 4  # 9 * 4 = 36 at column 2
    assert tuple(both(img)[3, 0, :2]) == (36, 0)


def test_dot_keeps_only_the_low_16_bits_and_leaves_b_and_a(gpu_device):
    n = 8
    img = np.zeros((4, n, 4), np.uint8)
    img[0, 0] = (1, 1, 2, 3)
    img[1, :, 0] = 255
    img[2, :, 0] = 255
    img[3, 0] = (9, 9, 123, 45)
    out = both(img)
    total = 8 * 255 * 255  # 520200 = 0x7F008 -> low 16 bits 0xF008
    assert tuple(out[3, 0]) == (total & 255, (total >> 8) & 255, 123, 45)


def test_add_saturates_at_255_and_writes_only_r(gpu_device):
    img = assemble(".size 6 4\nADD 1 2 3\n.vector 1 200 1 0 7\n.vector 2 100 2 0 0")
    img[1, 2] = (0, 1, 0, 0)  # not a zero pair: length continues past column 2
    img[3, :, 1:] = 77
    out = both(img)
    assert out[3, :4, 0].tolist() == [255, 3, 0, 7]
    assert np.all(out[3, :, 1:] == 77)


def test_u8_matmul_saturates_each_element_and_writes_the_header(gpu_device):
    src = """.size 8 12
    MATMUL 1 3 6
    .matrix 1 2 2 200 100 3 4
    .matrix 3 2 2 1 2 3 4"""
    out = both(assemble(src))
    assert tuple(out[6, 0]) == (2, 0, 2, 0)  # header: 2 columns, 2 rows
    # [[200*1+100*3, 200*2+100*4], [3*1+4*3, 3*2+4*4]] = [[500, 800], [15, 22]]
    assert out[6, 1:5, 0].tolist() == [255, 255, 15, 22]


def test_int8_matmul_bias_requant_relu_argmax_chain(gpu_device):
    src = """.size 16 400
    MATMUL_I8 1 3 300
    BIAS_I32 300 6
    REQUANT 300 7 8
    RELU_I8 8
    ARGMAX_I32 300 10
    .matrix 1 2 3 1 -2 3 -4 5 -6
    .matrix 3 3 2 7 -8 9 10 -11 12
    .matrix32 6 1 2 -70000 5
    .requant 7 300 4 -3"""
    img = assemble(src)
    assert img[0, 0, 0] == 10  # ROWHI prefix for row 300
    out = both(img)
    # A @ B = [[1*7-2*9+3*-11, 1*-8-2*10+3*12], [-4*7+5*9-6*-11, -4*-8+5*10-6*12]]
    #       = [[-44, 8], [83, 10]];  + bias [-70000, 5] -> [[-70044, 13], [-69917, 15]]
    acc = out[300, 1:5].copy().view("<i4").ravel().tolist()
    assert acc == [-70044, 13, -69917, 15]
    # requant: sign * round(|c| * 300 / 16) - 3, saturated: -70044 -> -128, 13 -> 244-3 -> 127
    # then RELU_I8 -> [0, 127, 0, 127]
    assert out[8, 1:5, 0].view(np.int8).tolist() == [0, 127, 0, 127]
    assert out[10, 1:3, 0].tolist() == [1, 1] and out[10, 1:3, 1].tolist() == [0, 0]


def test_requant_rounds_half_away_from_zero_and_applies_zero_point(gpu_device):
    # c = [5, -5, 3, -3, 1000000, -2147483648], mult 1, shift 1 -> 2.5 -> 3, -3, 1.5 -> 2, -2
    src = """.size 8 10
    REQUANT 1 3 4
    .matrix32 1 1 6 5 -5 3 -3 1000000 -2147483648
    .requant 3 1 1 10"""
    out = both(assemble(src))
    assert out[4, 1:7, 0].view(np.int8).tolist() == [13, 7, 12, 8, 127, -128]


def test_wrapping_int32_accumulation_is_identical(gpu_device):
    k = 300  # 300 * 127 * 127 fits; the bias pushes past 2^31 and must wrap
    src = f""".size 64 30
    MATMUL_I8 1 12 25
    BIAS_I32 25 28
    .matrix 1 1 {k} {' '.join(['127'] * k)}
    .matrix 12 {k} 1 {' '.join(['127'] * k)}
    .matrix32 28 1 1 2147483647"""
    out = both(assemble(src))
    expected = (k * 127 * 127 + 2147483647 + 2**31) % 2**32 - 2**31
    assert out[25, 1].copy().view("<i4")[0] == expected


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**32 - 1))
def test_random_valid_programs_run_byte_identically(gpu_device, seed):
    both(random_program(seed))
