"""The work budget: every instruction counts the elements it touches (docs/pixel-protocol.md,
section 2), and a program over the budget is refused before anything runs, with the same
error from the CPU and the GPU executor."""

import time

import numpy as np
import pytest

from pxvm.vm import BudgetExceededError, protocol, run_program_cpu, run_program_gpu, validate_program
from pxvm.vm import cpu as cpu_executor
from pxvm.vm.assembler import assemble
from pxvm.vm.protocol import OP_DOT_RGB, OP_MATMUL_I8, OP_ROWHI, WORK_BUDGET, instruction_work
from programs import random_program

WIDTH = 8
# one program per opcode, and its work counted by hand from the protocol's table
PROGRAMS = {
    "DOT_RGB": (".size 8 6\nDOT_RGB 1 2 3\n.vector 1 1 2 3\n.vector 2 4 5 6", 2 * WIDTH),
    "ADD": (".size 8 6\nADD 1 2 3\n.vector 1 1 2 3\n.vector 2 4 5 6", 3 * WIDTH),
    "RELU": (".size 8 4\nRELU 1", 1),
    "MATMUL": (".size 8 8\nMATMUL 1 2 4\n.matrix 1 2 3 1 2 3 4 5 6\n"
               ".matrix 2 3 4 1 2 3 4 5 6 7 8 9 10 11 12", 2 * 3 * 4),
    "MATMUL_I8": (".size 8 8\nMATMUL_I8 1 2 4\n.matrix 1 2 3 1 -2 3 -4 5 -6\n"
                  ".matrix 2 3 4 1 2 3 4 5 6 7 8 9 10 11 -12", 2 * 3 * 4),
    "BIAS_I32": (".size 8 8\nBIAS_I32 1 4\n.matrix32 1 3 5 " + " ".join(map(str, range(15)))
                 + "\n.matrix32 4 1 5 -1 -2 -3 -4 70000", 15 + 5),
    "REQUANT": (".size 8 8\nREQUANT 1 2 3\n.matrix32 1 2 3 100 -200 300 -400 500 -600\n"
                ".requant 2 1000 4 -3", 6 + 6),
    "RELU_I8": (".size 8 8\nRELU_I8 1\n.matrix 1 3 3 1 -2 3 -4 5 -6 7 -8 9", 9),
    "ARGMAX_I32": (".size 8 8\nARGMAX_I32 1 4\n.matrix32 1 4 3 " + " ".join(map(str, range(12)))
                   + "\n", 12 + 4),
}


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_each_opcode_counts_the_elements_it_touches(name):
    source, work = PROGRAMS[name]
    program = validate_program(assemble(source))
    assert [ins.name for ins in program.instructions] == [name]
    assert program.work == work == instruction_work(program.instructions[0], WIDTH) >= 1


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_a_program_at_the_budget_runs_and_one_unit_over_is_refused(gpu_device, monkeypatch, name):
    source, work = PROGRAMS[name]
    img = assemble(source)
    monkeypatch.setattr(protocol, "WORK_BUDGET", work)
    np.testing.assert_array_equal(run_program_cpu(img), run_program_gpu(img))
    monkeypatch.setattr(protocol, "WORK_BUDGET", work - 1)
    for run in (run_program_cpu, run_program_gpu):
        with pytest.raises(BudgetExceededError,
                           match=rf"pixel \(x=0, y=0\).*: {name} counts {work:,} toward the work "
                                 rf"budget .*, {work:,} with the instructions before it; a "
                                 rf"program may ask for at most {work - 1:,}"):
            run(img)


def test_the_budget_adds_up_over_the_program(monkeypatch):
    img = assemble(".size 8 6\nDOT_RGB 1 2 3\nADD 1 2 4\nRELU 5\n.vector 1 1 2\n.vector 2 3 4")
    assert validate_program(img).work == 16 + 24 + 1
    monkeypatch.setattr(protocol, "WORK_BUDGET", 16 + 24)
    with pytest.raises(BudgetExceededError, match=r"x=2, .*RELU counts 1 toward the work budget "
                                                  r"\(every instruction counts at least 1\), 41"):
        validate_program(img)


def dot_program(width: int, count: int, height: int = 4) -> np.ndarray:
    """`count` DOT_RGB over rows 1 and 2 of `width` pixels (of which none ends the vectors)."""
    img = np.zeros((height, width, 4), np.uint8)
    img[1:3, :, 0] = 1
    img[0, :count] = (OP_DOT_RGB, 1, 2, 3)
    return img


def test_the_issues_dot_rgb_program_over_huge_rows_is_refused_before_running():
    # 4096 DOT_RGB over 16.7-million-pixel rows ran for about an hour before v1.2
    img = dot_program(1 << 24, 4096)
    start = time.perf_counter()
    with pytest.raises(BudgetExceededError,
                       match=r"x=128, y=0\).*DOT_RGB counts 33,554,432 toward the work budget "
                             r"\(2 rows of width 16,777,216\), 4,328,521,728 with the "
                             r"instructions before it; a program may ask for at most "
                             r"4,294,967,296"):
        run_program_cpu(img)
    assert time.perf_counter() - start < 2


def test_huge_row_programs_get_the_same_refusal_from_both_executors(gpu_device):
    img = dot_program(1 << 22, 4096)  # 64 MB: within lavapipe's binding size
    errors = []
    for run in (run_program_cpu, run_program_gpu):
        with pytest.raises(BudgetExceededError, match=r"x=512, y=0\).*DOT_RGB counts "
                                                      r"8,388,608") as caught:
            run(img)
        errors.append(str(caught.value))
    assert errors[0] == errors[1]


def test_dot_programs_up_to_the_real_budget_validate_and_past_it_are_refused(gpu_device):
    width = WORK_BUDGET // (2 * 4096)  # 4096 instructions of 2 x width each: the budget exactly
    assert validate_program(dot_program(width, 4096)).work == WORK_BUDGET
    wider = dot_program(width + 1, 4096)
    for run in (validate_program, run_program_cpu, run_program_gpu):
        with pytest.raises(BudgetExceededError, match=r"x=4095, y=0\)"):
            run(wider)


def matmul_header_program(m: int, k: int, n: int, width: int = 4097) -> np.ndarray:
    """One MATMUL_I8 of an m x k by a k x n matrix (zero elements); only headers matter."""
    stride = width - 1
    a_row = 1
    b_row = a_row + -(-m * k // stride)
    c_row = b_row + -(-k * n // stride)
    height = c_row + -(-m * n // stride)
    img = np.zeros((height, width, 4), np.uint8)
    img[a_row, 0] = (k & 255, k >> 8, m & 255, m >> 8)
    img[b_row, 0] = (n & 255, n >> 8, k & 255, k >> 8)
    rows = (a_row, b_row, c_row)
    img[0, 0] = (OP_ROWHI, *(r >> 8 for r in rows))
    img[0, 1] = (OP_MATMUL_I8, *(r & 255 for r in rows))
    return img


def test_a_matmul_at_the_real_budget_validates_and_one_column_more_is_refused(gpu_device):
    assert validate_program(matmul_header_program(2048, 2048, 1024)).work == WORK_BUDGET
    over = matmul_header_program(2048, 2048, 1025)
    for run in (run_program_cpu, run_program_gpu):
        with pytest.raises(BudgetExceededError, match=r"MATMUL_I8 counts 4,299,161,600 toward "
                                                      r"the work budget \(2048 x 2048 x 1025 "
                                                      r"multiply-adds\)"):
            run(over)


def test_cpu_executor_in_tiny_blocks_agrees_with_the_gpu(gpu_device, monkeypatch, rng):
    """The CPU executor works through vectors and matrices in blocks; with blocks of a few
    elements every block boundary case occurs, and the GPU (one thread per element) is the
    independent reference."""
    monkeypatch.setattr(cpu_executor, "CHUNK", 5)
    monkeypatch.setattr(cpu_executor, "MATMUL_BLOCK", 12)
    monkeypatch.setattr(cpu_executor, "EXACT_K", 2)
    for seed in rng.integers(0, 2**32, 25):
        img = random_program(int(seed))
        np.testing.assert_array_equal(run_program_cpu(img), run_program_gpu(img))


@pytest.mark.parametrize("k", [2000, 65535])
def test_long_int8_dot_products_are_exact_past_float32(gpu_device, rng, k):
    """Sums of int8 products beyond 2^24 (float32's exact integers) come out exact."""
    a = rng.integers(-128, 128, k)
    b = rng.integers(-128, 128, k)
    a[:2000], b[:2000] = -128, -128  # 2000 * 16384 = 32,768,000 > 2^24 on their own
    width = 4097
    rows = -(-k // (width - 1))
    source = "\n".join([f".size {width} {2 * rows + 2}", f"MATMUL_I8 1 {1 + rows} {1 + 2 * rows}",
                        f".matrix 1 1 {k} " + " ".join(map(str, a)),
                        f".matrix {1 + rows} {k} 1 " + " ".join(map(str, b))])
    img = assemble(source)
    out = run_program_cpu(img)
    expected = int(np.dot(a, b))  # exact in int64
    assert abs(expected) > 1 << 24
    assert out[1 + 2 * rows, 1].view("<i4")[0] == expected
    np.testing.assert_array_equal(out, run_program_gpu(img))
