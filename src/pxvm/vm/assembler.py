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

import shlex

import numpy as np

from .protocol import (MNEMONICS, OP_HALT, OP_REQUANT, OP_ROWHI, OPCODES, ROW_ARGS, Matrix,
                       ProgramError, element_positions, validate_program)


class AssemblyError(ProgramError):
    """A .pxs source line that cannot be assembled; names the line."""


def _ints(tokens, lineno, what):
    try:
        return [int(t, 0) for t in tokens]
    except ValueError:
        raise AssemblyError(f"line {lineno}: {what} must be integers, got {' '.join(tokens)!r}") from None


def assemble(source: str) -> np.ndarray:
    """Assemble .pxs text into an (H, W, 4) uint8 image."""
    img = None
    x = 0
    for lineno, raw in enumerate(source.splitlines(), 1):
        line = raw.split(";", 1)[0].strip()
        if not line:
            continue
        tokens = shlex.split(line)
        head, rest = tokens[0], tokens[1:]
        if head == ".size":
            w, h = _ints(rest, lineno, ".size arguments")
            if img is not None:
                raise AssemblyError(f"line {lineno}: .size given twice")
            if not (2 <= w <= 65535 and 1 <= h <= 65535):
                raise AssemblyError(f"line {lineno}: .size {w} {h}: width must be 2..65535, height 1..65535")
            img = np.zeros((h, w, 4), np.uint8)
            continue
        if img is None:
            raise AssemblyError(f"line {lineno}: the program must start with `.size WIDTH HEIGHT`")
        h, w = img.shape[:2]
        if head.startswith("."):
            _directive(img, head, rest, lineno)
            continue
        name = head.upper()
        if name not in OPCODES:
            raise AssemblyError(f"line {lineno}: unknown instruction {head!r}; known: "
                                + ", ".join(OPCODES))
        op = OPCODES[name]
        args = _ints(rest, lineno, f"{name} arguments")
        if len(args) > 3:
            raise AssemblyError(f"line {lineno}: {name} takes at most 3 arguments")
        args = args + [0] * (3 - len(args))
        pixels = []
        n_rows = ROW_ARGS.get(op, 0)
        if op != OP_ROWHI and any(a > 255 for a in args[:n_rows]):
            pixels.append((OP_ROWHI, *[(a >> 8) if i < n_rows else 0 for i, a in enumerate(args)]))
            args = [a & 255 if i < n_rows else a for i, a in enumerate(args)]
        if any(not 0 <= a <= 255 for a in args):
            raise AssemblyError(f"line {lineno}: {name} arguments must be 0..255 "
                                f"(row arguments up to 65535), got {args}")
        pixels.append((op, *args))
        for px in pixels:
            if x >= w:
                raise AssemblyError(f"line {lineno}: row 0 is full ({w} instructions); widen .size")
            img[0, x] = px
            x += 1
    if img is None:
        raise AssemblyError("empty program: it must start with `.size WIDTH HEIGHT`")
    return img


def _check_row(img, y, lineno, what):
    if not 0 <= y < img.shape[0]:
        raise AssemblyError(f"line {lineno}: {what} row {y} is outside the image (0..{img.shape[0] - 1})")


def _directive(img, head, rest, lineno):
    h, w = img.shape[:2]
    if head == ".vector":
        y, *values = _ints(rest, lineno, ".vector values")
        _check_row(img, y, lineno, ".vector")
        if len(values) > w:
            raise AssemblyError(f"line {lineno}: {len(values)} values do not fit in a row of {w}")
        img[y, : len(values), 0] = np.array(values, np.int64) & 255
    elif head in (".matrix", ".matrix32"):
        y, rows, cols, *values = _ints(rest, lineno, f"{head} values")
        _check_row(img, y, lineno, head)
        if len(values) != rows * cols:
            raise AssemblyError(f"line {lineno}: {head} {rows}x{cols} needs {rows * cols} values, "
                                f"got {len(values)}")
        m = Matrix(y, rows, cols)
        if y + m.image_rows(w) > h:
            raise AssemblyError(f"line {lineno}: {head} at row {y} does not fit in the image")
        img[y, 0] = (cols & 255, cols >> 8, rows & 255, rows >> 8)
        ys, xs = element_positions(m, w)
        vals = np.array(values, np.int64)
        if head == ".matrix":
            img[ys, xs, 0] = vals & 255
        else:
            img[ys, xs] = (vals & 0xFFFFFFFF).astype("<u4").view(np.uint8).reshape(-1, 4)
    elif head == ".requant":
        y, mult, shift, zp = _ints(rest, lineno, ".requant values")
        _check_row(img, y, lineno, ".requant")
        img[y, 1] = np.array([mult & 0xFFFFFFFF], "<u4").view(np.uint8)
        img[y, 2, 0], img[y, 2, 1] = shift & 255, zp & 255
    elif head == ".pixel":
        x, y, *rgba = _ints(rest, lineno, ".pixel values")
        _check_row(img, y, lineno, ".pixel")
        if not 0 <= x < w or len(rgba) != 4:
            raise AssemblyError(f"line {lineno}: .pixel X Y R G B A with X in 0..{w - 1}")
        img[y, x] = np.array(rgba) & 255
    elif head == ".row":
        (y,) = _ints(rest[:1], lineno, ".row number")
        _check_row(img, y, lineno, ".row")
        hexdata = "".join(rest[1:])
        if len(hexdata) % 8 or len(hexdata) // 8 > w:
            raise AssemblyError(f"line {lineno}: .row needs 8 hex digits per pixel, at most {w} pixels")
        try:
            data = bytes.fromhex(hexdata)
        except ValueError:
            raise AssemblyError(f"line {lineno}: .row data is not hexadecimal") from None
        img[y, : len(data) // 4] = np.frombuffer(data, np.uint8).reshape(-1, 4)
    else:
        raise AssemblyError(f"line {lineno}: unknown directive {head!r}")


def disassemble(img: np.ndarray) -> str:
    """Readable text that assembles back to exactly `img`."""
    h, w = img.shape[:2]
    lines = [f"; pxVM program, Pixel Protocol 1.1", f".size {w} {h}"]
    notes = {}
    try:
        prog = validate_program(img)
        for ins in prog.instructions:
            notes[ins.x] = _describe(ins)
    except ProgramError as exc:
        lines.append(f"; note: this program does not validate: {exc}")
    halted = False
    for x in range(w):
        r, g, b, a = (int(v) for v in img[0, x])
        if halted or r not in MNEMONICS:
            halted = True  # instructions are placed in order from column 0: stop decoding
            if (r, g, b, a) != (0, 0, 0, 0):
                lines.append(f".pixel {x} 0 {r} {g} {b} {a}")
            continue
        text = f"{MNEMONICS[r]} {g} {b} {a}"
        lines.append(text + (f"    ; {notes[x]}" if x in notes else ""))
        if r == OP_HALT:
            halted = True
    for y in range(1, h):
        row = img[y]
        nz = np.flatnonzero(np.any(row != 0, axis=1))
        if nz.size:
            data = row[: nz[-1] + 1].tobytes().hex()
            lines.append(f".row {y} {data}")
    return "\n".join(lines) + "\n"


def _describe(ins) -> str:
    if ins.mats:
        parts = [f"row {m.row} ({m.rows}x{m.cols})" for m in ins.mats]
        text = ", ".join(parts)
        if ins.opcode == OP_REQUANT:
            text += " mult={} shift={} zp={}".format(*ins.extra)
        return text
    return "rows " + ", ".join(str(r) for r in ins.rows)
