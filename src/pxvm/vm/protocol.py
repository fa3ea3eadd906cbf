"""The Pixel Protocol v1.2 (docs/pixel-protocol.md): opcodes, the matrix layout, and the
shared validator that decodes an image into a checked program before anything runs.

Both executors run the decoded `Program`, so they agree on what every instruction means:
matrix shapes are fixed by the validator (from the headers in the image before execution,
or from the header an earlier instruction writes), and row 0 is read-only code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from ..core.errors import PxvmError

PROTOCOL_VERSION = "1.2"

OP_HALT = 0
OP_DOT_RGB = 1
OP_ADD = 2
OP_RELU = 3
OP_MATMUL = 4
OP_MATMUL_I8 = 5
OP_BIAS_I32 = 6
OP_REQUANT = 7
OP_RELU_I8 = 8
OP_ARGMAX_I32 = 9
OP_ROWHI = 10

MNEMONICS = {
    OP_HALT: "HALT", OP_DOT_RGB: "DOT_RGB", OP_ADD: "ADD", OP_RELU: "RELU",
    OP_MATMUL: "MATMUL", OP_MATMUL_I8: "MATMUL_I8", OP_BIAS_I32: "BIAS_I32",
    OP_REQUANT: "REQUANT", OP_RELU_I8: "RELU_I8", OP_ARGMAX_I32: "ARGMAX_I32",
    OP_ROWHI: "ROWHI",
}
OPCODES = {v: k for k, v in MNEMONICS.items()}
#: How many of (G, B, A) are row numbers (extended by a preceding ROWHI).
ROW_ARGS = {OP_DOT_RGB: 3, OP_ADD: 3, OP_RELU: 1, OP_MATMUL: 3, OP_MATMUL_I8: 3,
            OP_BIAS_I32: 2, OP_REQUANT: 3, OP_RELU_I8: 1, OP_ARGMAX_I32: 2}

#: Instructions executed at most (HALT excluded); longer programs are refused up front.
INSTRUCTION_BUDGET = 4096
#: Work one program may ask for in all, counted per instruction by `instruction_work`:
#: bounds every executor's running time (the CPU executor's slowest admitted programs
#: take seconds, not hours) before anything runs.
WORK_BUDGET = 1 << 32
#: Largest image accepted (pixels); executors may impose a lower device limit.
MAX_PIXELS = 1 << 26
REQUANT_MAX_SHIFT = 31
REQUANT_MAX_MULT = 1 << 16


class ProgramError(PxvmError):
    """A malformed .pxi program; the message names the pixel and the reason."""


class BudgetExceededError(ProgramError):
    """The program asks for more instructions or work than the budget allows."""


@dataclass(frozen=True)
class Matrix:
    """A matrix in the image: header pixel at (0, row), elements from (1, row) on,
    row-major, wrapping to the next image rows with a stride of width - 1."""

    row: int
    rows: int
    cols: int

    @property
    def size(self) -> int:
        return self.rows * self.cols

    def image_rows(self, width: int) -> int:
        """Image rows the header and elements occupy."""
        return max(1, -(-self.size // (width - 1)))


def element_positions(m: Matrix, width: int, start: int = 0,
                      stop: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """(y, x) image coordinates of elements start..stop - 1 of `m` (all by default),
    row-major."""
    idx = np.arange(start, m.size if stop is None else stop)
    return m.row + idx // (width - 1), 1 + idx % (width - 1)


@dataclass(frozen=True)
class Instruction:
    x: int            # column of the instruction pixel in row 0
    opcode: int
    rows: tuple       # resolved row arguments (ROWHI applied)
    args: tuple       # raw (G, B, A)
    mats: tuple = ()  # Matrix operands/results, fixed by the validator
    extra: tuple = () # opcode-specific constants (e.g. REQUANT multiplier)

    @property
    def name(self) -> str:
        return MNEMONICS[self.opcode]


@dataclass
class Program:
    height: int
    width: int
    instructions: list = field(default_factory=list)
    work: int = 0


def check_image(img) -> np.ndarray:
    """The image as a contiguous (H, W, 4) uint8 array, or a ProgramError saying why not."""
    if not isinstance(img, np.ndarray):
        raise ProgramError(f"a program image must be a numpy array, got {type(img).__name__}")
    if img.dtype != np.uint8:
        raise ProgramError(f"a program image must have dtype uint8, got {img.dtype}; "
                           "RGBA pixels are 4 bytes")
    if img.ndim != 3 or img.shape[2] != 4:
        raise ProgramError(f"a program image must have shape (H, W, 4) (RGBA), got {img.shape}")
    h, w = img.shape[:2]
    if h == 0 or w == 0:
        raise ProgramError(f"the program image is empty ({h}x{w})")
    if w < 2:
        raise ProgramError("a program image needs a width of at least 2 (matrices start at column 1)")
    if h * w > MAX_PIXELS:
        raise ProgramError(f"the image has {h * w:,} pixels; pxVM accepts at most {MAX_PIXELS:,}")
    return np.ascontiguousarray(img)


def _i32(px) -> int:
    return int(np.frombuffer(bytes(int(c) for c in px), "<i4")[0])


def validate_program(img, max_pixels: int | None = None) -> Program:
    """Decode and check the instruction row; raise ProgramError naming the pixel."""
    img = check_image(img)
    h, w = img.shape[:2]
    if max_pixels is not None and h * w > max_pixels:
        raise ProgramError(f"the image has {h * w:,} pixels but this device takes at most "
                           f"{max_pixels:,}; use a smaller program or the CPU executor")
    prog = Program(h, w)
    shapes: dict[int, tuple[int, int]] = {}  # row -> (rows, cols) written by earlier MATMULs
    written: list[tuple[int, int, int]] = []  # (first row, last row + 1, x) of earlier writes
    hi = (0, 0, 0)
    pending_hi = False
    for x in range(w):
        r, g, b, a = (int(v) for v in img[0, x])
        where = f"instruction pixel (x={x}, y=0) = ({r}, {g}, {b}, {a})"
        if r == OP_HALT:
            if pending_hi:
                raise ProgramError(f"{where}: HALT right after ROWHI (ROWHI must prefix an instruction)")
            break
        if r not in MNEMONICS:
            raise ProgramError(f"{where}: unknown opcode {r}; known: "
                               + ", ".join(f"{k}={v}" for k, v in MNEMONICS.items()))
        if r == OP_ROWHI:
            if pending_hi:
                raise ProgramError(f"{where}: two ROWHI prefixes in a row")
            hi, pending_hi = (g, b, a), True
            continue
        if len(prog.instructions) >= INSTRUCTION_BUDGET:
            raise BudgetExceededError(
                f"{where}: the program has more than {INSTRUCTION_BUDGET} instructions before "
                "HALT; that is the instruction budget of every executor")
        n_rows = ROW_ARGS[r]
        raw = (g, b, a)
        rows = tuple(hi[i] * 256 + raw[i] for i in range(n_rows))
        hi, pending_hi = (0, 0, 0), False
        for i, row in enumerate(rows):
            if row >= h:
                raise ProgramError(f"{where}: row argument {i} is {row}, outside the image "
                                   f"(rows 0..{h - 1})")
        ins = _check_instruction(img, x, r, rows, raw, shapes, where)
        if r == OP_REQUANT:
            _params_not_computed(rows[1], written, where)
        written.extend(_rows_written(ins, w))
        work = instruction_work(ins, w)
        if prog.work + work > WORK_BUDGET:
            raise BudgetExceededError(
                f"{where}: {ins.name} counts {work:,} toward the work budget "
                f"({_work_rule(ins, w)}), {prog.work + work:,} with the instructions before it; "
                f"a program may ask for at most {WORK_BUDGET:,} (the budget of every executor)")
        prog.work += work
        prog.instructions.append(ins)
    else:
        if pending_hi:
            raise ProgramError(f"instruction row ends right after a ROWHI prefix (x={w - 1})")
    return prog


def _matrix_at(img, row, shapes, where, what) -> Matrix:
    h, w = img.shape[:2]
    if row == 0:
        raise ProgramError(f"{where}: {what} at row 0, which holds the instructions")
    if row in shapes:
        rows, cols = shapes[row]
    else:
        c0, c1, r0, r1 = (int(v) for v in img[row, 0])
        cols, rows = c0 + 256 * c1, r0 + 256 * r1
    if rows == 0 or cols == 0:
        raise ProgramError(f"{where}: {what} header at pixel (x=0, y={row}) declares a "
                           f"{rows}x{cols} matrix; both sizes must be at least 1")
    m = Matrix(row, rows, cols)
    if row + m.image_rows(w) > h:
        raise ProgramError(f"{where}: {what} at row {row} ({rows}x{cols}) needs image rows "
                           f"{row}..{row + m.image_rows(w) - 1}, past the last row {h - 1}")
    return m


def _result_matrix(img, row, rows, cols, shapes, where, what) -> Matrix:
    h, w = img.shape[:2]
    if row == 0:
        raise ProgramError(f"{where}: {what} would be written to row 0 (the instructions)")
    m = Matrix(row, rows, cols)
    if row + m.image_rows(w) > h:
        raise ProgramError(f"{where}: {what} ({rows}x{cols}) at row {row} would need image rows "
                           f"up to {row + m.image_rows(w) - 1}, past the last row {h - 1}")
    shapes[row] = (rows, cols)
    return m


def _no_overlap(where, width, out: Matrix, *inputs: Matrix) -> None:
    """A result must not share image rows with the same instruction's inputs: the GPU
    computes all elements at once, so reads and writes of one region would race."""
    lo, hi = out.row, out.row + out.image_rows(width)
    for m in inputs:
        if m.row < hi and lo < m.row + m.image_rows(width):
            raise ProgramError(
                f"{where}: the result at rows {lo}..{hi - 1} overlaps an operand at rows "
                f"{m.row}..{m.row + m.image_rows(width) - 1}; write results to free rows")


def _check_instruction(img, x, op, rows, raw, shapes, where) -> Instruction:
    w = img.shape[1]
    if op in (OP_DOT_RGB, OP_ADD):
        if rows[0] == 0 or rows[1] == 0:
            raise ProgramError(f"{where}: vector rows must not be row 0 (the instructions)")
        if rows[2] == 0:
            raise ProgramError(f"{where}: the result would be written to row 0 (the instructions)")
        return Instruction(x, op, rows, raw)
    if op == OP_RELU:
        return Instruction(x, op, rows, raw)  # v1.0: a no-op on unsigned data
    if op in (OP_MATMUL, OP_MATMUL_I8):
        a = _matrix_at(img, rows[0], shapes, where, "matrix A")
        b = _matrix_at(img, rows[1], shapes, where, "matrix B")
        if a.cols != b.rows:
            raise ProgramError(f"{where}: shape mismatch: A at row {a.row} is {a.rows}x{a.cols} "
                               f"but B at row {b.row} is {b.rows}x{b.cols} (A's columns must "
                               "equal B's rows)")
        c = _result_matrix(img, rows[2], a.rows, b.cols, shapes, where, "result C")
        _no_overlap(where, w, c, a, b)
        return Instruction(x, op, rows, raw, (a, b, c))
    if op == OP_BIAS_I32:
        c = _matrix_at(img, rows[0], shapes, where, "int32 matrix")
        bias = _matrix_at(img, rows[1], shapes, where, "bias")
        if bias.size != c.cols:
            raise ProgramError(f"{where}: shape mismatch: bias at row {bias.row} has {bias.size} "
                               f"elements but the matrix at row {c.row} has {c.cols} columns")
        _no_overlap(where, w, c, bias)
        return Instruction(x, op, rows, raw, (c, bias))
    if op == OP_REQUANT:
        c = _matrix_at(img, rows[0], shapes, where, "int32 matrix")
        if rows[1] == 0:
            raise ProgramError(f"{where}: requantize parameters at row 0 (the instructions)")
        mult = _i32(img[rows[1], 1])
        shift, zp = int(img[rows[1], 2, 0]), int(img[rows[1], 2, 1].astype(np.int8))
        if not 0 <= mult < REQUANT_MAX_MULT:
            raise ProgramError(f"{where}: requantize multiplier at pixel (x=1, y={rows[1]}) is "
                               f"{mult}; it must be in 0..{REQUANT_MAX_MULT - 1}")
        if shift > REQUANT_MAX_SHIFT:
            raise ProgramError(f"{where}: requantize shift at pixel (x=2, y={rows[1]}) is {shift}; "
                               f"it must be at most {REQUANT_MAX_SHIFT}")
        out = _result_matrix(img, rows[2], c.rows, c.cols, shapes, where, "requantized matrix")
        _no_overlap(where, w, out, c, Matrix(rows[1], 1, 2))
        return Instruction(x, op, rows, raw, (c, out), (mult, shift, zp))
    if op == OP_RELU_I8:
        m = _matrix_at(img, rows[0], shapes, where, "int8 matrix")
        return Instruction(x, op, rows, raw, (m,))
    if op == OP_ARGMAX_I32:
        m = _matrix_at(img, rows[0], shapes, where, "int32 matrix")
        out = _result_matrix(img, rows[1], m.rows, 1, shapes, where, "argmax result")
        _no_overlap(where, w, out, m)
        return Instruction(x, op, rows, raw, (m, out))
    raise AssertionError(op)


def _rows_written(ins: Instruction, width: int) -> list[tuple[int, int, int]]:
    """Image rows an instruction may write (ADD: its whole output row, since the vector
    length is only known when it runs; DOT writes column 0 only, which no parameter uses)."""
    if ins.opcode == OP_ADD:
        return [(ins.rows[2], ins.rows[2] + 1, ins.x)]
    if ins.opcode in (OP_MATMUL, OP_MATMUL_I8, OP_REQUANT, OP_ARGMAX_I32):
        m = ins.mats[-1]
    elif ins.opcode in (OP_BIAS_I32, OP_RELU_I8):
        m = ins.mats[0]
    else:
        return []
    return [(m.row, m.row + m.image_rows(width), ins.x)]


def _params_not_computed(row: int, written, where) -> None:
    """REQUANT parameters are constants read before execution (the GPU takes them as
    uniforms), so a program that computes them would mean different things to an executor
    reading them late; it is refused instead."""
    for lo, hi, x in written:
        if lo <= row < hi:
            raise ProgramError(f"{where}: requantize parameters at row {row} are written by the "
                               f"earlier instruction at x={x}; parameters must be constants of "
                               "the image, so put them in rows no instruction writes")


def instruction_work(ins: Instruction, width: int) -> int:
    """The instruction's count against the work budget: the elements it touches, at least 1.

    DOT_RGB and ADD: their vector length is only known when they run (any column up to the
    width may end it), so they count whole rows: DOT_RGB the two rows it reads (2 x W),
    ADD those and the row it writes (3 x W). MATMUL and MATMUL_I8 count their
    multiply-adds M x K x N (at least as many as the elements of each operand and of the
    result); the other matrix instructions the elements of their operands and result.
    RELU touches nothing and counts 1."""
    if ins.opcode == OP_DOT_RGB:
        return 2 * width
    if ins.opcode == OP_ADD:
        return 3 * width
    if ins.opcode in (OP_MATMUL, OP_MATMUL_I8):
        a, b, _ = ins.mats
        return a.rows * a.cols * b.cols
    return max(1, sum(m.size for m in ins.mats))


def _work_rule(ins: Instruction, width: int) -> str:
    """How `instruction_work` counted `ins`, for the budget error."""
    if ins.opcode == OP_DOT_RGB:
        return f"2 rows of width {width:,}"
    if ins.opcode == OP_ADD:
        return f"3 rows of width {width:,}"
    if ins.opcode in (OP_MATMUL, OP_MATMUL_I8):
        a, b, _ = ins.mats
        return f"{a.rows} x {a.cols} x {b.cols} multiply-adds"
    if ins.mats:
        return " + ".join(f"{m.size:,}" for m in ins.mats) + " matrix elements"
    return "every instruction counts at least 1"
