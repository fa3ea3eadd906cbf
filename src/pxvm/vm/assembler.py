"""Assembler and disassembler between pxVM assembly text (.pxs) and .pxi images.

    .size 16 16                ; width height (required, first)
    DOT_RGB 1 2 3              ; instructions fill row 0 from column 0, in order
    HALT
    .vector 1 1 2 3 4          ; R channel of row 1 from column 0
    .matrix 5 2 3 1 -2 3 4 5 6 ; header at row 5, 2x3 matrix of u8/i8 values (R channel)
    .matrix32 9 1 3 -70000 5 6 ; int32 matrix (all four channels, little-endian)
    .requant 12 1234 16 -3     ; REQUANT parameters: multiplier, shift, zero point
    .pixel 3 7 255 0 0 255     ; one raw pixel: x y r g b a
    .row 4 0a000000ff000000    ; raw pixels of a row from column 0, 8 hex digits each

Row arguments above 255 get a ROWHI prefix automatically. `disassemble` writes raw
instructions and `.row` lines, so `assemble(disassemble(img))` gives `img` back exactly.
"""

from __future__ import annotations

import re
from itertools import repeat

import numpy as np

from ..core.errors import shortened
from .protocol import (MAX_PIXELS, MNEMONICS, OP_HALT, OP_REQUANT, OP_ROWHI, OPCODES,
                       PROTOCOL_VERSION, REQUANT_MAX_MULT, REQUANT_MAX_SHIFT, ROW_ARGS, Matrix,
                       ProgramError, element_positions, validate_program)

#: Largest row number an instruction can address (a ROWHI prefix and the low byte).
MAX_ROW = 65535
I32_MIN, I32_MAX = -(1 << 31), (1 << 31) - 1


class AssemblyError(ProgramError):
    """A .pxs source line that cannot be assembled; names the line."""


def _tokens(text: str, most: int, lineno: int, what: str) -> list[str]:
    """The whitespace-separated tokens of `text`, refusing more than `most` of them without
    splitting (or converting) the rest of the line."""
    tokens = text.split(None, most)
    if len(tokens) > most:
        raise AssemblyError(f"line {lineno}: {what} takes at most {most} values here; the line "
                            "has more")
    return tokens


#: The longest integer token read: every value is at most 32 bits (in binary with
#: underscores, under 50 characters); longer ones are refused before being converted.
MAX_INT_CHARS = 64


def _ints(tokens, lineno, what) -> list[int]:
    values = []
    for t in tokens:
        if len(t) > MAX_INT_CHARS:
            raise AssemblyError(f"line {lineno}: {what}: {shortened(t, 40)!r} has {len(t):,} "
                                f"characters; a value here has at most {MAX_INT_CHARS} (every "
                                "value is at most 32 bits)")
        try:
            values.append(int(t, 0))
        except ValueError:
            raise AssemblyError(
                f"line {lineno}: {what} must be integers, got {shortened(t, 40)!r}") from None
    return values


def _in_range(values, lo: int, hi: int, lineno: int, what: str) -> None:
    """AssemblyError naming the first value outside lo..hi (no value is ever wrapped)."""
    if values and not (lo <= min(values) and max(values) <= hi):
        bad = next(v for v in values if not lo <= v <= hi)
        raise AssemblyError(f"line {lineno}: {what} {bad} is outside its range {lo}..{hi}")


def _count(tokens, expected: int, lineno: int, what: str) -> None:
    if len(tokens) != expected:
        raise AssemblyError(f"line {lineno}: {what} takes {expected} values, got {len(tokens)}")


def assemble(source: str) -> np.ndarray:
    """Assemble .pxs text into an (H, W, 4) uint8 image."""
    img = None
    x = 0
    for lineno, raw in enumerate(source.splitlines(), 1):
        parts = raw.split(";", 1)[0].split(None, 1)
        if not parts:
            continue
        head, rest = parts[0], (parts[1] if len(parts) > 1 else "")
        if head == ".size":
            if img is not None:
                raise AssemblyError(f"line {lineno}: .size given twice")
            img = _size(_tokens(rest, 2, lineno, ".size"), lineno)
            continue
        if img is None:
            raise AssemblyError(f"line {lineno}: the program must start with `.size WIDTH HEIGHT`")
        if head.startswith("."):
            _directive(img, head, rest, lineno)
            continue
        for px in _instruction(head, rest, lineno):
            if x >= img.shape[1]:
                raise AssemblyError(f"line {lineno}: row 0 is full ({img.shape[1]} instructions); "
                                    "widen .size")
            img[0, x] = px
            x += 1
    if img is None:
        raise AssemblyError("empty program: it must start with `.size WIDTH HEIGHT`")
    return img


def _size(tokens, lineno) -> np.ndarray:
    _count(tokens, 2, lineno, ".size")
    w, h = _ints(tokens, lineno, ".size arguments")
    _in_range([w], 2, 65535, lineno, ".size width")
    _in_range([h], 1, 65535, lineno, ".size height")
    if w * h > MAX_PIXELS:  # refused before the image is allocated
        raise AssemblyError(f"line {lineno}: .size {w} {h} is {w * h:,} pixels; a program has at "
                            f"most {MAX_PIXELS:,}")
    return np.zeros((h, w, 4), np.uint8)


def _instruction(head, rest, lineno) -> list[tuple]:
    """The pixels of one instruction: a ROWHI prefix first when a row is past 255."""
    name = head.upper()
    if name not in OPCODES:
        raise AssemblyError(f"line {lineno}: unknown instruction {shortened(head, 40)!r}; known: "
                            + ", ".join(OPCODES))
    op = OPCODES[name]
    args = _ints(_tokens(rest, 3, lineno, name), lineno, f"{name} arguments")
    n_rows = ROW_ARGS.get(op, 0)
    for i, a in enumerate(args):
        if i < n_rows:
            _in_range([a], 0, MAX_ROW, lineno, f"{name} row argument {i + 1}")
        else:
            _in_range([a], 0, 255, lineno, f"{name} argument {i + 1}")
    args = args + [0] * (3 - len(args))
    if not any(a > 255 for a in args[:n_rows]):
        return [(op, *args)]
    high = [a >> 8 if i < n_rows else 0 for i, a in enumerate(args)]
    return [(OP_ROWHI, *high), (op, *[a & 255 for a in args])]


def _check_row(img, y, lineno, what):
    if not 0 <= y < img.shape[0]:
        raise AssemblyError(f"line {lineno}: {what} row {y} is outside the image (0..{img.shape[0] - 1})")


def _directive(img, head, rest, lineno):
    w = img.shape[1]
    if head == ".vector":
        tokens = _tokens(rest, 1 + w, lineno, ".vector (a row number and one value a column)")
        if not tokens:
            raise AssemblyError(f"line {lineno}: .vector needs a row number")
        y, *values = _ints(tokens, lineno, ".vector values")
        _check_row(img, y, lineno, ".vector")
        _in_range(values, 0, 255, lineno, ".vector value")
        img[y, : len(values), 0] = values
    elif head in (".matrix", ".matrix32"):
        _matrix(img, head, rest, lineno)
    elif head == ".requant":
        tokens = _tokens(rest, 4, lineno, ".requant")
        _count(tokens, 4, lineno, ".requant (row, multiplier, shift, zero point)")
        y, mult, shift, zp = _ints(tokens, lineno, ".requant values")
        _check_row(img, y, lineno, ".requant")
        if w < 3:
            raise AssemblyError(f"line {lineno}: .requant writes pixels 1 and 2 of its row; the "
                                f"image is {w} wide")
        _in_range([mult], 0, REQUANT_MAX_MULT - 1, lineno, ".requant multiplier")
        _in_range([shift], 0, REQUANT_MAX_SHIFT, lineno, ".requant shift")
        _in_range([zp], -128, 127, lineno, ".requant zero point")
        img[y, 1] = np.array([mult], "<u4").view(np.uint8)
        img[y, 2, 0], img[y, 2, 1] = shift, zp & 255
    elif head == ".pixel":
        tokens = _tokens(rest, 6, lineno, ".pixel")
        _count(tokens, 6, lineno, ".pixel (X Y R G B A)")
        x, y, *rgba = _ints(tokens, lineno, ".pixel values")
        _check_row(img, y, lineno, ".pixel")
        _in_range([x], 0, w - 1, lineno, ".pixel column")
        _in_range(rgba, 0, 255, lineno, ".pixel channel value")
        img[y, x] = rgba
    elif head == ".row":
        tokens = _tokens(rest, 1 + w, lineno, ".row (a row number and pixels)")
        if not tokens:
            raise AssemblyError(f"line {lineno}: .row needs a row number")
        (y,) = _ints(tokens[:1], lineno, ".row number")
        _check_row(img, y, lineno, ".row")
        hexdata = "".join(tokens[1:])
        if len(hexdata) % 8 or len(hexdata) // 8 > w:
            raise AssemblyError(f"line {lineno}: .row needs 8 hex digits per pixel, at most {w} pixels")
        try:
            data = bytes.fromhex(hexdata)
        except ValueError:
            raise AssemblyError(f"line {lineno}: .row data is not hexadecimal") from None
        img[y, : len(data) // 4] = np.frombuffer(data, np.uint8).reshape(-1, 4)
    else:
        raise AssemblyError(f"line {lineno}: unknown directive {shortened(head, 40)!r}")


# Characters of a matrix's values split and converted at a time: a line of millions of
# values never becomes a list of millions of tokens and Python ints.
_VALUES_CHUNK = 1 << 18
_MATRIX_HEADER = re.compile(r"\s*(\S+)\s+(\S+)\s+(\S+)")  # ROW ROWS COLS
_SPACE = re.compile(r"\s")


def _matrix(img, head, rest, lineno):
    """.matrix / .matrix32 ROW ROWS COLS values...: the header is checked (and the matrix
    fitted into the image) before the values are split or converted, and the values are
    placed a chunk at a time."""
    h, w = img.shape[:2]
    header = _MATRIX_HEADER.match(rest)
    if header is None:
        raise AssemblyError(f"line {lineno}: {head} needs ROW ROWS COLS and the values")
    y, rows, cols = _ints(header.groups(), lineno, f"{head} row and sizes")
    _check_row(img, y, lineno, head)
    _in_range([rows], 1, 65535, lineno, f"{head} row count")
    _in_range([cols], 1, 65535, lineno, f"{head} column count")
    m = Matrix(y, rows, cols)
    if y + m.image_rows(w) > h:
        raise AssemblyError(f"line {lineno}: {head} {rows}x{cols} at row {y} needs image rows up "
                            f"to {y + m.image_rows(w) - 1}, past the last row {h - 1}")
    img[y, 0] = (cols & 255, cols >> 8, rows & 255, rows >> 8)
    placed = 0
    for tokens in _token_chunks(rest, header.end()):
        if placed + len(tokens) > m.size:
            raise AssemblyError(f"line {lineno}: {head} {rows}x{cols} takes at most {m.size} "
                                "values here; the line has more")
        values = _matrix_values(tokens, placed, lineno, head)
        ys, xs = element_positions(m, w, placed, placed + len(values))
        if head == ".matrix":
            img[ys, xs, 0] = values & 255  # u8, or i8 as two's complement
        else:
            img[ys, xs] = values.astype("<i4").view(np.uint8).reshape(-1, 4)
        placed += len(values)
    if placed != m.size:
        raise AssemblyError(f"line {lineno}: {head} {rows}x{cols} needs {m.size} values, "
                            f"got {placed}")


def _token_chunks(text: str, start: int):
    """The whitespace-separated tokens of text[start:], in lists of _VALUES_CHUNK
    characters' worth (cut at whitespace, never inside a token)."""
    while start < len(text):
        space = _SPACE.search(text, start + _VALUES_CHUNK)
        end = space.end() if space else len(text)
        yield text[start:end].split()
        start = end


def _matrix_values(tokens, first: int, lineno: int, head: str) -> np.ndarray:
    """The values of `tokens`, values first + 1.. of a matrix (errors say which: a matrix
    line may hold millions of them)."""
    try:
        values = list(map(int, tokens, repeat(0)))
    except ValueError:
        i, bad = next((i, t) for i, t in enumerate(tokens) if not _is_int(t))
        raise AssemblyError(f"line {lineno}: {head} values must be integers, got "
                            f"{shortened(bad, 40)!r} (value {first + i + 1})") from None
    lo, hi = (-128, 255) if head == ".matrix" else (I32_MIN, I32_MAX)
    if values and not (lo <= min(values) and max(values) <= hi):
        i, bad = next((i, v) for i, v in enumerate(values) if not lo <= v <= hi)
        raise AssemblyError(f"line {lineno}: {head} value {bad} is outside its range {lo}..{hi} "
                            f"(value {first + i + 1})")
    return np.array(values, np.int64)


def _is_int(token: str) -> bool:
    try:
        int(token, 0)
    except ValueError:
        return False
    return True


def disassemble(img: np.ndarray) -> str:
    """Readable text that assembles back to exactly `img`."""
    return "".join(line + "\n" for line in disassembly_lines(img))


def disassembly_lines(img: np.ndarray):
    """disassemble's lines, one at a time: a large image's text (twice its bytes, in hex)
    is written out as it is made instead of being held whole."""
    h, w = img.shape[:2]
    yield f"; pxVM program, Pixel Protocol {PROTOCOL_VERSION}"
    yield f".size {w} {h}"
    notes = {}
    try:
        prog = validate_program(img)
        for ins in prog.instructions:
            notes[ins.x] = _describe(ins)
    except ProgramError as exc:
        yield f"; note: this program does not validate: {exc}"
    x = 0
    while x < w:  # instructions are placed in order from column 0: decode up to the first
        r, g, b, a = (int(v) for v in img[0, x])  # HALT or unknown opcode
        if r not in MNEMONICS:
            break
        text = f"{MNEMONICS[r]} {g} {b} {a}"
        yield text + (f"    ; {notes[x]}" if x in notes else "")
        x += 1
        if r == OP_HALT:
            break
    for col in x + np.flatnonzero(np.any(img[0, x:] != 0, axis=1)):
        yield ".pixel {} 0 {} {} {} {}".format(int(col), *(int(v) for v in img[0, col]))
    for y in range(1, h):
        row = img[y]
        nz = np.flatnonzero(np.any(row != 0, axis=1))
        if nz.size:
            data = row[: nz[-1] + 1].tobytes().hex()
            yield f".row {y} {data}"


def _describe(ins) -> str:
    if ins.mats:
        parts = [f"row {m.row} ({m.rows}x{m.cols})" for m in ins.mats]
        text = ", ".join(parts)
        if ins.opcode == OP_REQUANT:
            text += " mult={} shift={} zp={}".format(*ins.extra)
        return text
    return "rows " + ", ".join(str(r) for r in ins.rows)
