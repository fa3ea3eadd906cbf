"""More hand-checked opcode edges from docs/pixel-protocol.md (expected values worked out
by hand): int8 extremes, argmax ties, wrapping below -2^31, rows past 255, the v1.0 RELU,
and REQUANT parameters that an earlier instruction would compute."""

import numpy as np
import pytest

from pxvm.vm import run_program_cpu, run_program_gpu, validate_program
from pxvm.vm.assembler import assemble
from pxvm.vm.protocol import ProgramError


def both(img):
    cpu = run_program_cpu(img)
    np.testing.assert_array_equal(cpu, run_program_gpu(img))
    return cpu


def test_relu_i8_clears_negatives_including_minus_128_and_keeps_g_b_a(gpu_device):
    img = assemble(".size 8 4\nRELU_I8 1\n.matrix 1 1 6 -128 -1 0 1 127 -7")
    img[1, 1:7, 1:] = 99
    out = both(img)
    assert out[1, 1:7, 0].view(np.int8).tolist() == [0, 0, 0, 1, 127, 0]
    assert np.all(out[1, 1:7, 1:] == 99)
    assert tuple(out[1, 0]) == (6, 0, 1, 0)  # header untouched


def test_argmax_takes_the_first_of_equal_maxima_and_handles_negatives(gpu_device):
    src = """.size 8 6
    ARGMAX_I32 1 4
    .matrix32 1 3 3 -5 -2 -2 7 7 7 -2147483648 -2147483648 2147483647"""
    out = both(assemble(src))
    assert tuple(out[4, 0]) == (1, 0, 3, 0)  # a 3x1 result header
    assert out[4, 1:4, 0].tolist() == [1, 0, 2] and out[4, 1:4, 1].tolist() == [0, 0, 0]


def test_bias_wraps_below_minus_2_pow_31(gpu_device):
    src = """.size 8 4
    BIAS_I32 1 2
    .matrix32 1 1 2 -2147483648 100
    .matrix32 2 1 2 -1 -100"""
    out = both(assemble(src))
    # -2^31 - 1 wraps to 2^31 - 1; 100 - 100 = 0
    assert out[1, 1:3].copy().view("<i4").ravel().tolist() == [2147483647, 0]


def test_requant_with_mult_0_gives_the_zero_point_and_shift_0_saturates(gpu_device):
    src = """.size 8 8
    REQUANT 1 3 4
    REQUANT 1 5 6
    .matrix32 1 1 3 1000 -1000 1
    .requant 3 0 7 -9
    .requant 5 2 0 0"""
    out = both(assemble(src))
    assert out[4, 1:4, 0].view(np.int8).tolist() == [-9, -9, -9]
    assert out[6, 1:4, 0].view(np.int8).tolist() == [127, -128, 2]  # 2000, -2000, 2


def test_dot_and_add_reach_rows_past_255_through_rowhi(gpu_device):
    src = """.size 4 600
    DOT_RGB 300 599 260
    ADD 300 599 598
    .vector 300 1 2 3
    .vector 599 4 5 254"""
    img = assemble(src)
    assert img[0, 0, 0] == 10 and tuple(img[0, 0, 1:]) == (1, 2, 1)  # the ROWHI prefix
    out = both(img)
    total = 1 * 4 + 2 * 5 + 3 * 254  # 776 = 3 * 256 + 8
    assert tuple(out[260, 0, :2]) == (8, 3)
    assert out[598, :3, 0].tolist() == [5, 7, 255]  # 3 + 254 saturates


def test_v1_relu_changes_nothing(gpu_device):
    img = assemble(".size 4 3\nRELU 1\n.vector 1 0 200 255 1")
    np.testing.assert_array_equal(both(img), img)


def test_requant_parameters_computed_by_an_earlier_instruction_are_refused():
    src = """.size 8 8
    ADD 2 2 3
    REQUANT 1 3 4
    .matrix32 1 1 1 5
    .vector 2 1 1 1
    .requant 3 1 0 0"""
    with pytest.raises(ProgramError, match=r"x=1, y=0.*written by the earlier instruction at x=0"):
        validate_program(assemble(src))


@pytest.mark.parametrize("width", [2, 3, 4, 9])
def test_int8_matmul_matches_numpy_when_matrices_wrap_over_narrow_rows(gpu_device, rng, width):
    # B's rows (7 elements) are wider than the image's element stride (width - 1), so
    # consecutive elements of a column lie several image rows apart.
    a = rng.integers(-128, 128, (3, 5))
    b = rng.integers(-128, 128, (5, 7))
    a_rows, b_rows = -(-15 // (width - 1)), -(-35 // (width - 1))
    rb, rc = 1 + a_rows, 1 + a_rows + b_rows
    src = f""".size {width} {rc + -(-21 // (width - 1))}
    MATMUL_I8 1 {rb} {rc}
    .matrix 1 3 5 {' '.join(map(str, a.ravel()))}
    .matrix {rb} 5 7 {' '.join(map(str, b.ravel()))}"""
    out = both(assemble(src))
    idx = np.arange(21)
    got = out[rc + idx // (width - 1), 1 + idx % (width - 1)].copy().view("<i4").reshape(3, 7)
    np.testing.assert_array_equal(got, a @ b)


def requantize_by_the_spec(c: int, mult: int, shift: int, zp: int) -> int:
    """Section 4's REQUANT in Python integers."""
    m = abs(c) * mult
    if shift > 0:
        m = (m + (1 << (shift - 1))) >> shift
    return max(-128, min(127, (m if c >= 0 else -m) + zp))


def test_cpu_requantize_is_exact_at_the_extremes(rng):
    """The CPU executor requantizes in float64; every value it can meet comes out exact."""
    from pxvm.vm.cpu import requantize

    acc = np.concatenate([rng.integers(-2**31, 2**31, 2000), rng.integers(-300, 300, 600),
                          [-2**31, 2**31 - 1, 0, 1, -1, 2**30, -(2**30) - 1]]).astype(np.int32)
    params = [(65535, 31, -128), (65535, 0, 127), (0, 0, 0), (1, 1, 0), (3, 2, -1), (1, 31, 0),
              (40503, 16, 5), (65535, 16, 0), (2, 1, -128)]
    params += [(int(rng.integers(0, 65536)), int(rng.integers(0, 32)), int(rng.integers(-128, 128)))
               for _ in range(20)]
    for mult, shift, zp in params:
        expected = [requantize_by_the_spec(int(c), mult, shift, zp) for c in acc]
        assert requantize(acc, mult, shift, zp).astype(int).tolist() == expected, (mult, shift, zp)
