"""GGUF rows to float values in PTX, exactly as the `gguf` package's dequantization
(quant_blocks.py decodes the units of every type).

`dequantize`: every row of W into a float16 (N, K) matrix (the prompts' quantized
products multiply it on tensor cores), or the rows that `ids` pick into float32 (S, K)
(embedding_quant; W holding rows first_row .. first_row + N - 1 of a table, ids outside
them give zeros). A thread a unit (32 values), grid-stride; it reads the GGUF rows
themselves (loads as wide as the blocks' alignment allows).
`dequantize_float_scalar`: the same for F32, F16, BF16 rows whose K is not a multiple of
32, a value a thread. `to_f16`: float32 to float16 (x for those products), VEC at a time.
"""

from __future__ import annotations

from .builder import Kernel, f32
from .elementwise import _load, _store_half
from .quant_blocks import FORMATS, Raw, store_words, unit
from .quantized import FLOAT_BYTES, float_value

#: (output type, rows picked by ids) of `dequantize`: float16 matrices for the products,
#: float32 rows for embeddings
OUTPUTS = (("f16", False), ("f32", True))
SIZES = {"f16": 2, "f32": 4}
VECS = (1, 4)


def _params(by_ids: bool) -> list[tuple[str, str]]:
    return [("w", "u64"), *([("ids", "u64")] if by_ids else []), ("y", "u64"),
            ("N", "u32"), ("K", "u32"), ("rows", "u32"), ("first_row", "u32")]


def _row(k: Kernel, ids, r, N, first_row, by_ids: bool):
    """(the weight row output row r reads, whether W holds it): r itself, or ids[r] -
    first_row (row 0 read where W does not hold it: its values are replaced by zeros)."""
    if not by_ids:
        return r, None
    n = k.op("sub.u32", k.load("u32", k.element(ids, r, 4)), first_row)  # wraps below
    held = k.setp("lt.u32", n, N)
    return k.op("selp.b32", n, 0, held), held


def _store(k: Kernel, address, values, out: str) -> None:
    """Values (a multiple of 8) at a 16-byte aligned address as `out`."""
    if out == "f32":
        for q in range(0, len(values), 4):
            k.store_vector("f32", f"{address}+{4 * q}", values[q:q + 4])
        return
    words = []
    for a, b in zip(values[::2], values[1::2]):
        halves = [k.op("cvt.rn.f16.f32", v) for v in (a, b)]
        word = k.reg("b32")
        k.emit(f"mov.b32 {word}, {{{halves[0]}, {halves[1]}}}")
        words.append(word)
    store_words(k, address, words, 16)


def dequantize(qtype: str, out: str = "f16", by_ids: bool = False) -> Kernel:
    """y (rows, K) of `out` values; rows = N (every row) or len(ids). Parameters: w,
    [ids,] y, N, K, rows, first_row (ignored without ids)."""
    fmt = FORMATS[qtype]
    reader = unit(fmt)
    src = Raw(fmt)
    k = Kernel(f"dequantize_{fmt.label}_{out}{'_ids' if by_ids else ''}", _params(by_ids))
    w, *rest = k.params()
    ids, (y, N, K, rows, first_row) = (rest[0], rest[1:]) if by_ids else (None, rest)
    src.bind(k, [w], K)
    size = SIZES[out]
    per_row = k.op("shr.u32", K, 5)
    total = k.op("mul.lo.u32", rows, per_row)
    i, stride = k.grid_stride()
    with k.loop(i, total, stride):
        r = k.op("div.u32", i, per_row)
        u = k.op("sub.u32", i, k.op("mul.lo.u32", r, per_row))
        n, held = _row(k, ids, r, N, first_row, by_ids)
        prep = reader.prepare(k, u)
        values = reader.values(k, reader.load(k, src, n, prep), prep)
        if held is not None:
            values = [k.op("selp.f32", v, f32(0.0), held) for v in values]
        out_row = k.op("add.u64", y, k.op("mul.wide.u32", r, k.op("mul.lo.u32", K, size)))
        at = 0
        for start, count in prep.segments:
            address = k.op("add.u64", out_row, k.op("mul.wide.u32", start, size))
            _store(k, address, values[at:at + count], out)
            at += count
    return k


def dequantize_float_scalar(qtype: str, out: str = "f16", by_ids: bool = False) -> Kernel:
    """`dequantize` of F32, F16 or BF16 rows of any K, a value a thread."""
    fmt = FORMATS[qtype]
    k = Kernel(f"dequantize_{fmt.label}_{out}{'_ids' if by_ids else ''}_scalar",
               _params(by_ids))
    w, *rest = k.params()
    ids, (y, N, K, rows, first_row) = (rest[0], rest[1:]) if by_ids else (None, rest)
    total = k.op("mul.lo.u32", rows, K)
    i, stride = k.grid_stride()
    with k.loop(i, total, stride):
        r = k.op("div.u32", i, K)
        c = k.op("sub.u32", i, k.op("mul.lo.u32", r, K))
        n, held = _row(k, ids, r, N, first_row, by_ids)
        value = float_value(k, qtype, k.element(w, k.op("mad.lo.u32", n, K, c),
                                               FLOAT_BYTES[qtype]))
        if held is not None:
            value = k.op("selp.f32", value, f32(0.0), held)
        if out == "f32":
            k.store("f32", k.element(y, i, 4), value)
        else:
            k.store("b16", k.element(y, i, 2), k.op("cvt.rn.f16.f32", value))
    return k


def to_f16(vec: int = 4) -> Kernel:
    """y = float16(x) for `count` values (a multiple of vec), vec at a time, grid-stride
    over the groups."""
    k = Kernel(f"to_f16_v{vec}", [("x", "u64"), ("y", "u64"), ("count", "u32")])
    x, y, count = k.params()
    groups = k.op("shr.u32", count, vec.bit_length() - 1)
    i, stride = k.grid_stride()
    with k.loop(i, groups, stride):
        _store_half(k, y, i, _load(k, x, i, vec))
    return k


def variants():
    for qtype, fmt in FORMATS.items():
        for out, by_ids in OUTPUTS:
            yield dequantize, (qtype, out, by_ids)
            if fmt.is_float:
                yield dequantize_float_scalar, (qtype, out, by_ids)
    for vec in VECS:
        yield to_f16, (vec,)
