"""GGUF weight blocks as the PTX kernels read them (quantized.py's products, dequantize.py's
float16 and embedding rows): each type's fields, where a kernel finds them, and its values
decoded a unit at a time. Not a kernel family: the families build on it.

A unit is 32 values of a row: a whole block of the 32-value types, a 16-byte run of quants
of the K types (8 units a 256-value super-block; 8 bytes of Q2_K's and Q3_K's 2-bit ones),
32 values of a float row. Its values need not be contiguous: `segments` says where in the
row they are, in the order the decoders give them. A unit reads its own quants and the
scales of its block (the threads of one block read those together).

Where the fields are: `Raw` reads the GGUF rows themselves (one pointer; the widest loads
the block's alignment allows: Q4_K's and Q5_K's 144- and 176-byte blocks are 16-byte
aligned, Q8_0's 34-byte ones only 2-byte); `Planes` reads the weight repacked
(quantized.repack) into one plane a field, each block's field at block * size, so that
16-byte loads are aligned for every type. Same bytes either way. `SharedRows` reads either
from shared memory, where a block's rows were copied first.

Decoding without conversions: a quant u < 128 (every type but Q8_0) becomes the float
0.5 + u / 256 by one byte permute (prmt: u into bits 16-22 under the exponent byte 0x3F),
so the products sum S = sum(f x) and use sum(u x) = 256 S - 128 sum(x) with the sum of
x over the scale's group, which the x values give once for all the rows a thread
multiplies. Exact values (dequantization) are 256 f - 128 - offset, exact in one fma,
then the scales applied in the `gguf` package's order of float32 operations (its
dequantization is the reference: the results agree bit for bit). Q8_0's signed bytes:
2^23 + (q + 128) by prmt, less 2^23 + 128 (exact).

Q4_K's and Q5_K's products go in integers instead (K4.dot_rows): each unit's x values
become int16 against their largest (int16_x: 16 bits of the largest value, where
llama.cpp's CUDA products take 8), the quants' sums with them by dp2a, two values an
instruction, the 6-bit scales and minimums multiplied in integers, one float step a row.

One module, long as it is: the thirteen GGUF layouts share the unit, the three sources
(Raw, Planes, SharedRows) and the decoding tricks above, and every kernel family that
reads weights uses the same decoders; split by type, each file would repeat them.
"""

from __future__ import annotations

from dataclasses import dataclass
from math import gcd

from .builder import Kernel, Reg, f32

#: Values a unit (see the module's docstring)
UNIT = 32
#: load of weight bytes: read once, so not kept in L1 (x's values stay there)
WEIGHT_LOAD = "ld.global.nc.L1::no_allocate"
LOW_NIBBLES = "0x0F0F0F0F"


@dataclass(frozen=True)
class Field:
    """`size` bytes at `offset` of every block."""

    name: str
    offset: int
    size: int


@dataclass(frozen=True)
class Format:
    """A GGML type: `block_values` values in `block_bytes` bytes, its fields; `planes`:
    the products read it repacked (its blocks are not 16-byte aligned). The float types
    are read as blocks of UNIT values (their rows then need K a multiple of UNIT)."""

    name: str
    block_values: int
    block_bytes: int
    fields: tuple[Field, ...]
    planes: bool = False
    is_float: bool = False

    @property
    def label(self) -> str:
        return self.name.lower()

    def field(self, name: str) -> Field:
        return next(f for f in self.fields if f.name == name)


def _format(name, values, size, fields, **kw) -> Format:
    return Format(name, values, size, tuple(Field(*f) for f in fields), **kw)


#: The types the kernels decode, by name (the table of pxvm.ops.quant_types, which the
#: tests check it against; the float types as UNIT-value blocks)
FORMATS: dict[str, Format] = {f.name: f for f in (
    _format("F32", 32, 128, [("v", 0, 128)], is_float=True),
    _format("F16", 32, 64, [("v", 0, 64)], is_float=True),
    _format("BF16", 32, 64, [("v", 0, 64)], is_float=True),
    _format("Q4_0", 32, 18, [("d", 0, 2), ("qs", 2, 16)], planes=True),
    _format("Q4_1", 32, 20, [("dm", 0, 4), ("qs", 4, 16)], planes=True),
    _format("Q5_0", 32, 22, [("d", 0, 2), ("qh", 2, 4), ("qs", 6, 16)], planes=True),
    _format("Q5_1", 32, 24, [("dm", 0, 4), ("qh", 4, 4), ("qs", 8, 16)], planes=True),
    _format("Q8_0", 32, 34, [("d", 0, 2), ("qs", 2, 32)], planes=True),
    _format("Q2_K", 256, 84, [("scales", 0, 16), ("qs", 16, 64), ("dm", 80, 4)],
            planes=True),
    _format("Q3_K", 256, 110, [("hmask", 0, 32), ("qs", 32, 64), ("scales", 96, 12),
                                   ("d", 108, 2)], planes=True),
    # d, dmin and the 12 scale bytes are one 16-byte head
    _format("Q4_K", 256, 144, [("head", 0, 16), ("qs", 16, 128)]),
    _format("Q5_K", 256, 176, [("head", 0, 16), ("qh", 16, 32), ("qs", 48, 128)]),
    _format("Q6_K", 256, 210, [("ql", 0, 128), ("qh", 128, 64), ("scales", 192, 16),
                                   ("d", 208, 2)], planes=True),
)}


# ---- where the fields are ----------------------------------------------------------------

class Source:
    """Addresses of a row's fields and the loads they allow. The fields lie in planes
    (`pointer`, by name): each row's bytes of a plane one after another, `row_bytes` of
    them a row. While `prefetching`, the units' loads are L2 prefetches of the same bytes
    instead (no registers)."""

    prefetching = False
    #: the weights' load instruction (the loads of load_words)
    load_instr = WEIGHT_LOAD

    def __init__(self, fmt: Format):
        self.fmt = fmt

    def params(self) -> list[tuple[str, str]]:
        raise NotImplementedError

    def bind(self, k: Kernel, pointers: list[Reg], K: Reg) -> None:
        """Sets `pointer` and `row_bytes` (plane name -> register) for rows of K values."""
        raise NotImplementedError

    def place(self, field: Field) -> tuple[str, int, int, int]:
        """(its plane, its offset in a block's part of the plane, that part's bytes, the
        alignment of its address)."""
        raise NotImplementedError

    def spans(self, k: Kernel, first: Reg, count: Reg) -> list[tuple[Reg, Reg]]:
        """(address, bytes) of rows first .. first + count - 1 in each plane."""
        return [(k.op("add.u64", self.pointer[p], k.op("mul.wide.u32", first, self.row_bytes[p])),
                 k.op("mul.lo.u32", count, self.row_bytes[p])) for p in self.pointer]

    def address(self, k: Kernel, n: Reg, field: Field, j: Reg, extra) -> tuple[Reg, int]:
        """(address of byte `extra` of `field` of block j of row n, its alignment)."""
        plane, offset, size, align = self.place(field)
        row = k.op("add.u64", self.pointer[plane],
                   k.op("mul.wide.u32", n, self.row_bytes[plane]))
        return k.op("add.u64", row, k.op("cvt.u64.u32", _in_row(k, j, size, offset, extra))), align


def _in_row(k: Kernel, j: Reg, size: int, offset: int, extra) -> Reg:
    """j * size + offset + extra (a register or a number)."""
    at = k.op("mad.lo.u32", j, size, offset) if offset else k.op("mul.lo.u32", j, size)
    return k.op("add.u32", at, extra) if isinstance(extra, Reg) or extra else at


def _log2(v: int) -> int:
    return v.bit_length() - 1


class Raw(Source):
    """The GGUF rows (N, row_bytes) at one pointer: one plane of whole blocks."""

    def params(self):
        return [("w", "u64")]

    def bind(self, k, pointers, K):
        self.pointer = {"w": pointers[0]}
        self.row_bytes = {"w": k.op("mul.lo.u32",
                                    k.op("shr.u32", K, _log2(self.fmt.block_values)),
                                    self.fmt.block_bytes)}

    def place(self, field):
        return "w", field.offset, self.fmt.block_bytes, gcd(self.fmt.block_bytes,
                                                             field.offset, 16)


class Planes(Source):
    """The weight repacked into one plane a field (`quantized.repack`): block i's field at
    plane + i * size, a plane a pointer."""

    def params(self):
        return [(f"w_{f.name}", "u64") for f in self.fmt.fields]

    def bind(self, k, pointers, K):
        self.pointer = dict(zip((f.name for f in self.fmt.fields), pointers))
        per_row = k.op("shr.u32", K, _log2(self.fmt.block_values))
        self.row_bytes = {f.name: k.op("mul.lo.u32", per_row, f.size) for f in self.fmt.fields}

    def place(self, field):
        return field.name, 0, field.size, gcd(field.size, 16)


def source(fmt: Format, planes: bool) -> Source:
    return Planes(fmt) if planes else Raw(fmt)


def staging_fits(fmt: Format, k: int) -> bool:
    """Whether rows of k values can be staged (`SharedRows`): every plane's rows a whole
    number of 16-byte chunks, so that each starts aligned for the bulk copies."""
    blocks = k // fmt.block_values
    sizes = [f.size for f in fmt.fields] if fmt.planes else [fmt.block_bytes]
    return k % fmt.block_values == 0 and all(blocks * size % 16 == 0 for size in sizes)


class SharedRows(Source):
    """The rows of `inner` copied into shared memory by Hopper's bulk copies
    (`copy_rows`), in `slots` places a plane: row n of the loads is slot n there, each
    plane's slots one after another. The rows need staging_fits."""

    load_instr = "ld.shared"

    def __init__(self, inner: Source, slots: int):
        super().__init__(inner.fmt)
        self.inner, self.slots = inner, slots

    def params(self):
        return self.inner.params()

    def bind(self, k, pointers, K):
        self.inner.bind(k, pointers, K)
        self.row_bytes = self.inner.row_bytes
        base = k.op("mov.u32", k.shared("staged", "b8", None))
        self.pointer = {}
        for plane, row_bytes in self.row_bytes.items():
            self.pointer[plane] = base
            base = k.op("mad.lo.u32", row_bytes, self.slots, base)

    def place(self, field):
        return self.inner.place(field)

    def copy_rows(self, k: Kernel, slot, first: Reg, count: Reg, barrier) -> None:
        """Queue the copies of inner's rows first .. first + count - 1 (count > 0) into
        slots slot .. , completing on `barrier`."""
        for plane, (address, nbytes) in zip(self.pointer, self.inner.spans(k, first, count)):
            to = k.op("mad.lo.u32", self.row_bytes[plane], slot, self.pointer[plane])
            k.bulk_copy(to, address, nbytes, barrier)

    def address(self, k, n, field, j, extra):
        plane, offset, size, align = self.place(field)
        row = k.op("mad.lo.u32", n, self.row_bytes[plane], self.pointer[plane])
        return k.op("add.u32", row, _in_row(k, j, size, offset, extra)), align


def load_words(k: Kernel, address: Reg, nbytes: int, align: int,
               instr: str = WEIGHT_LOAD) -> list[Reg]:
    """`nbytes` (a multiple of 4) at `address` as 32-bit words, by the widest loads its
    alignment allows (16 bits at a time for 2-byte aligned blocks)."""
    words: list[Reg] = []
    if align >= 4:
        width = 4 if align >= 16 and nbytes % 16 == 0 else 2 if align >= 8 and nbytes % 8 == 0 else 1
        for at in range(0, nbytes, 4 * width):
            regs = [k.reg("b32") for _ in range(width)]
            if width == 1:
                k.emit(f"{instr}.b32 {regs[0]}, [{address}+{at}]")
            else:
                k.emit(f"{instr}.v{width}.b32 {{{', '.join(map(str, regs))}}}, [{address}+{at}]")
            words += regs
        return words
    for at in range(0, nbytes, 4):
        halves = [k.reg("b16") for _ in range(2)]
        for h, half in enumerate(halves):
            k.emit(f"{instr}.b16 {half}, [{address}+{at + 2 * h}]")
        word = k.reg("b32")
        k.emit(f"mov.b32 {word}, {{{halves[0]}, {halves[1]}}}")
        words.append(word)
    return words


def store_words(k: Kernel, address: Reg, words: list[Reg], align: int) -> None:
    """The words at `address` by the widest stores its alignment allows."""
    n = len(words)
    if align >= 4:
        width = 4 if align >= 16 and n % 4 == 0 else 2 if align >= 8 and n % 2 == 0 else 1
        for i in range(0, n, width):
            if width == 1:
                k.store("b32", f"{address}+{4 * i}", words[i])
            else:
                k.store_vector("b32", f"{address}+{4 * i}", words[i:i + width])
        return
    for i, word in enumerate(words):
        halves = [k.reg("b16") for _ in range(2)]
        k.emit(f"mov.b32 {{{halves[0]}, {halves[1]}}}, {word}")
        for h, half in enumerate(halves):
            k.store("b16", f"{address}+{4 * i + 2 * h}", half)


def load_half(k: Kernel, address: Reg, instr: str = WEIGHT_LOAD) -> Reg:
    half = k.reg("b16")
    k.emit(f"{instr}.b16 {half}, [{address}]")
    return half


def halves_f32(k: Kernel, word: Reg) -> tuple[Reg, Reg]:
    """The two float16 halves of a word, as float32 (exact)."""
    lo, hi = k.reg("b16"), k.reg("b16")
    k.emit(f"mov.b32 {{{lo}, {hi}}}, {word}")
    return k.op("cvt.f32.f16", lo), k.op("cvt.f32.f16", hi)


# ---- values from bytes -------------------------------------------------------------------

def small_f32(k: Kernel, word: Reg, byte, minus: int = 0) -> Reg:
    """float(byte `byte` of `word` - minus), exact: the byte under the exponent of 2^23
    (prmt), less 2^23 + minus. `byte`: 0..3 or a register holding it."""
    if isinstance(byte, Reg):
        selector = k.op("or.b32", byte, 0x7650)
    else:
        selector = 0x7650 | byte
    bits = k.op("prmt.b32", word, 0x4B000000, selector)
    return k.op("sub.f32", _as_f32(k, bits), f32(8388608.0 + minus))


def _as_f32(k: Kernel, bits: Reg) -> Reg:
    out = k.reg("f32")
    k.emit(f"mov.b32 {out}, {bits}")
    return out


def _exponent(k: Kernel) -> Reg:
    """0x3F000000 in a register ptxas cannot tell is constant (tid.x >> 10 is 0), made once
    a kernel, at its first use (the kernels' uses are all in the one loop body where it is
    made): with the constant as prmt's data operand ptxas takes the immediate slot for it
    and moves the selectors into registers at every use (a fifth of Q4_K's instructions);
    this way the selector is the immediate."""
    reg = getattr(k, "_exponent_reg", None)
    if reg is None:
        reg = k.op("or.b32", k.op("shr.u32", k.special("%tid.x"), 10), 0x3F000000)
        k._exponent_reg = reg
    return reg


def biased(k: Kernel, word: Reg, byte: int) -> Reg:
    """0.5 + u / 256 for the byte `byte` (0..3) of `word` holding u < 128 (exact)."""
    return _as_f32(k, k.op("prmt.b32", word, _exponent(k), 0x7054 | (byte << 8)))


def nibbles(k: Kernel, words: list[Reg]) -> tuple[list[Reg], list[Reg]]:
    """(low nibbles, high nibbles) of each word, a byte each."""
    low = [k.op("and.b32", w, LOW_NIBBLES) for w in words]
    high = [k.op("and.b32", k.op("shr.u32", w, 4), LOW_NIBBLES) for w in words]
    return low, high


def with_bits(k: Kernel, words: list[Reg], bits: list[Reg], shift, mask: str,
              to: int) -> list[Reg]:
    """words | ((bits >> shift) & mask) << to, word by word (the high bits of 5- and
    6-bit quants, a byte each)."""
    out = []
    for w, b in zip(words, bits):
        part = k.op("and.b32", k.op("shr.u32", b, shift), mask)
        out.append(k.op("or.b32", w, k.op("shl.b32", part, to)))
    return out


@dataclass
class Scale:
    """A group's scale terms: value = a * (u - c), or a * u + b where b is given (the
    types with minimums)."""

    a: Reg
    c: int = 0
    b: Reg | None = None

    def dot_terms(self, k: Kernel) -> tuple[Reg, Reg]:
        """(A, B): sum over the group of value * x = A * sum(f x) + B * sum(x), f = 0.5 +
        u / 256."""
        big = k.op("mul.f32", self.a, f32(256.0))
        if self.b is None:
            return big, k.op("mul.f32", self.a, f32(-(128.0 + self.c)))
        return big, k.op("fma.rn.f32", self.a, f32(-128.0), self.b)

    def value(self, k: Kernel, f: Reg) -> Reg:
        """The exact value of f = 0.5 + u / 256, in gguf's order of operations."""
        if self.b is None:
            q = k.op("fma.rn.f32", f, f32(256.0), f32(-(128.0 + self.c)))
            return k.op("mul.rn.f32", self.a, q)
        q = k.op("fma.rn.f32", f, f32(256.0), f32(-128.0))
        return k.op("add.rn.f32", k.op("mul.rn.f32", self.a, q), self.b)


# ---- units ---------------------------------------------------------------------------------

@dataclass
class Prep:
    """A unit's per-thread facts: its block j, part p, where its values are in the row
    (segments: (first value, count) in decoding order) and what the type needs besides."""

    j: Reg
    p: Reg | int
    segments: list[tuple[Reg, int]]
    extra: dict


class Unit:
    """How one type's units are read and decoded. `groups`: the counts of values sharing
    a scale, in decoding order (None: no scales, the float types and Q8_0)."""

    groups: tuple[int, ...] | None = None

    def __init__(self, fmt: Format):
        self.fmt = fmt

    def prepare(self, k: Kernel, u: Reg) -> Prep:
        raise NotImplementedError

    def load(self, k: Kernel, src: Source, n: Reg, prep: Prep) -> dict:
        raise NotImplementedError

    def decode(self, k: Kernel, loaded: dict, prep: Prep) -> tuple[list[Reg], list[Scale]]:
        """(8 words holding the 32 quants u < 128 a byte each, in decoding order; the
        groups' scales)."""
        raise NotImplementedError

    def x_terms(self, k: Kernel, xs: list[Reg]):
        """What dot_rows takes of the unit's 32 x values (in decoding order), made once for
        all the rows a thread multiplies: the values and their sums by group."""
        sums, v = [], 0
        for count in self.groups or ():
            sums.append(k.tree("add.f32", xs[v:v + count]))
            v += count
        return xs, sums

    # the generic uses of decode
    def dot_rows(self, k: Kernel, rows: list[dict], prep: Prep, terms,
                 accs: list[Reg]) -> list[Reg]:
        """accs + the sums of each row's unit values times x (terms: x_terms'). The rows
        go together, value by value: every row's loaded words are in use from the start,
        so that ptxas issues all their loads before the products (it moves a load down
        to its first use where registers are short)."""
        xs, sums = terms
        decoded = [self.decode(k, loaded, prep) for loaded in rows]
        terms = [[scale.dot_terms(k) for scale in scales] for _, scales in decoded]
        partial = [[None] * len(self.groups) for _ in rows]
        v = 0
        for g, count in enumerate(self.groups):
            for i in range(v, v + count):
                for r, (words, _) in enumerate(decoded):
                    f = biased(k, words[i // 4], i % 4)
                    s = partial[r][g]
                    partial[r][g] = (k.op("mul.f32", f, xs[i]) if s is None
                                     else k.op("fma.rn.f32", f, xs[i], s))
            v += count
        out = []
        for acc, row_terms, row_partial in zip(accs, terms, partial):
            for g, ((big, small), s) in enumerate(zip(row_terms, row_partial)):
                acc = k.op("fma.rn.f32", big, s, acc)
                acc = k.op("fma.rn.f32", small, sums[g], acc)
            out.append(acc)
        return out

    def values(self, k: Kernel, loaded: dict, prep: Prep) -> list[Reg]:
        """The unit's 32 values, exact, in decoding order."""
        words, scales = self.decode(k, loaded, prep)
        out, v = [], 0
        for count, scale in zip(self.groups, scales):
            out += [scale.value(k, biased(k, words[i // 4], i % 4)) for i in range(v, v + count)]
            v += count
        return out


def _load(k, src, n, fmt, name, j, extra, nbytes, extra_align):
    field = fmt.field(name)
    address, align = src.address(k, n, field, j, extra)
    if src.prefetching:
        k.emit(f"prefetch.global.L2 [{address}]")
        return [None] * (nbytes // 4)
    return load_words(k, address, nbytes, gcd(align, extra_align), src.load_instr)


def _half(k, src, n, fmt, name, j):
    address, _ = src.address(k, n, fmt.field(name), j, 0)
    if src.prefetching:
        k.emit(f"prefetch.global.L2 [{address}]")
        return None
    return k.op("cvt.f32.f16", load_half(k, address, src.load_instr))


def bulk_prefetch(k: Kernel, address: Reg, nbytes: Reg) -> None:
    """Ask L2 for `nbytes` at `address` (sm_90's bulk prefetch, one instruction; its
    range widened to whole 16-byte chunks, at most the 1 MB one instruction takes: the
    bytes around are in the same allocation, allocations being whole 512-byte granules)."""
    start = k.op("and.b64", address, "0xFFFFFFFFFFFFFFF0")
    end = k.op("add.u64", k.op("add.u64", address, k.op("cvt.u64.u32", nbytes)), 15)
    size = k.op("cvt.u32.u64", k.op("sub.u64", k.op("and.b64", end, "0xFFFFFFFFFFFFFFF0"),
                                    start))
    size = k.op("min.u32", size, 0xFFFF0)
    k.emit(f"cp.async.bulk.prefetch.L2.global [{start}], {size}")


class Block32(Unit):
    """The 32-value types: a unit is a block, its values in order (Q4_0, Q4_1, Q5_0, Q5_1
    keep values 0..15 in the low nibbles of their 16 bytes, 16..31 in the high ones)."""

    groups = (32,)

    def prepare(self, k, u):
        return Prep(u, 0, [(k.op("shl.b32", u, 5), 32)], {})

    def load(self, k, src, n, prep):
        fmt, j = self.fmt, prep.j
        out = {"qs": _load(k, src, n, fmt, "qs", j, 0, fmt.field("qs").size, 16)}
        if fmt.name in ("Q4_1", "Q5_1"):
            out["dm"] = _load(k, src, n, fmt, "dm", j, 0, 4, 4)[0]
        else:
            out["d"] = _half(k, src, n, fmt, "d", j)
        if fmt.name in ("Q5_0", "Q5_1"):
            out["qh"] = _load(k, src, n, fmt, "qh", j, 0, 4, 4)[0]
        return out

    def decode(self, k, loaded, prep):
        low, high = nibbles(k, loaded["qs"])
        if "qh" in loaded:
            # fifth bit of value i: bit i of qh; for 4 values at once, 4 bits spread to
            # bit 4 of each byte by one multiply (the shifted copies do not overlap)
            qh = loaded["qh"]
            low = [k.op("or.b32", w, _spread(k, qh, 4 * i)) for i, w in enumerate(low)]
            high = [k.op("or.b32", w, _spread(k, qh, 16 + 4 * i)) for i, w in enumerate(high)]
        if "dm" in loaded:
            d, m = halves_f32(k, loaded["dm"])
            return low + high, [Scale(d, b=m)]
        return low + high, [Scale(loaded["d"], c=16 if "qh" in loaded else 8)]


def _spread(k: Kernel, bits: Reg, first: int) -> Reg:
    """Bits first .. first + 3 of `bits` as bit 4 of bytes 0..3."""
    four = k.op("and.b32", k.op("shr.u32", bits, first), 15)
    return k.op("and.b32", k.op("mul.lo.u32", four, 0x02040810), 0x10101010)


class Q8_0(Unit):
    """Q8_0: a block of 32 int8 values and a float16 scale; signed bytes, so its own
    decoding (see the module's docstring)."""

    def prepare(self, k, u):
        return Prep(u, 0, [(k.op("shl.b32", u, 5), 32)], {})

    def load(self, k, src, n, prep):
        fmt, j = self.fmt, prep.j
        return {"qs": _load(k, src, n, fmt, "qs", j, 0, 32, 16),
                "d": _half(k, src, n, fmt, "d", j)}

    def _quants(self, k, loaded):
        out = []
        for w in loaded["qs"]:
            unsigned = k.op("xor.b32", w, "0x80808080")
            out += [small_f32(k, unsigned, b, 128) for b in range(4)]
        return out

    def dot_rows(self, k, rows, prep, terms, accs):
        xs, _ = terms
        partial = [None] * len(rows)
        for w in range(8):  # word by word, every row (see Unit.dot_rows)
            for r, loaded in enumerate(rows):
                unsigned = k.op("xor.b32", loaded["qs"][w], "0x80808080")
                for b in range(4):
                    q, x, s = small_f32(k, unsigned, b, 128), xs[4 * w + b], partial[r]
                    partial[r] = k.op("mul.f32", q, x) if s is None else k.op("fma.rn.f32", q, x, s)
        return [k.op("fma.rn.f32", loaded["d"], s, acc)
                for loaded, s, acc in zip(rows, partial, accs)]

    def values(self, k, loaded, prep):
        return [k.op("mul.rn.f32", q, loaded["d"]) for q in self._quants(k, loaded)]


class Floats(Unit):
    """F32, F16, BF16: 32 values of a row."""

    def prepare(self, k, u):
        return Prep(u, 0, [(k.op("shl.b32", u, 5), 32)], {})

    def load(self, k, src, n, prep):
        return {"v": _load(k, src, n, self.fmt, "v", prep.j, 0, self.fmt.block_bytes, 16)}

    def values(self, k, loaded, prep):
        words = loaded["v"]
        if self.fmt.name == "F32":
            return [_as_f32(k, w) for w in words]
        if self.fmt.name == "F16":
            return [v for w in words for v in halves_f32(k, w)]
        out = []  # BF16: the high 16 bits of a float32
        for w in words:
            out.append(_as_f32(k, k.op("shl.b32", w, 16)))
            out.append(_as_f32(k, k.op("and.b32", w, "0xFFFF0000")))
        return out

    def dot_rows(self, k, rows, prep, terms, accs):
        xs, _ = terms
        values = [self.values(k, loaded, prep) for loaded in rows]
        accs = list(accs)
        for i, x in enumerate(xs):  # value by value, every row (see Unit.dot_rows)
            for r, row in enumerate(values):
                accs[r] = k.op("fma.rn.f32", row[i], x, accs[r])
        return accs


#: int16_x's largest |q|
X_STEPS = 32767
#: 1.5 * 2^23: fma(x, a, X_ROUND)'s low 16 bits are rint(x * a) as int16 (|x a| < 2^22)
X_ROUND = 12582912.0


def int16_x(k: Kernel, xs: list[Reg],
            groups: tuple[int, ...]) -> tuple[list[Reg], list[Reg], Reg]:
    """x as integers for products by dp2a: q = rint(x / s), s = max |x| / X_STEPS over
    the values (|x - s q| <= s / 2: 16 bits against the largest value; a non-finite x
    makes s non-finite, and so the product). Returns (q's in pairs, 16 bits each, two
    values a word; the sums of q by group; s)."""
    largest = k.tree("max.NaN.f32", [k.op("abs.f32", v) for v in xs])
    # 1e-30: no overflow in 1 / s where x is all zeros or tiny
    s = k.op("mul.rn.f32", k.op("max.NaN.f32", largest, f32(1e-30)), f32(1 / X_STEPS))
    a = k.op("rcp.approx.f32", s)  # within 2 ulp: |x a| stays below X_STEPS + 0.5
    bits = [k.op("fma.rn.f32", v, a, f32(X_ROUND)) for v in xs]
    pairs = [k.op("prmt.b32", lo, hi, 0x5410) for lo, hi in zip(bits[::2], bits[1::2])]
    sums, v = [], 0
    for count in groups:
        total = 0
        for pair in pairs[v // 2:(v + count) // 2]:
            total = k.op("dp2a.lo.s32.u32", pair, "0x01010101", total)
        sums.append(total)
        v += count
    return pairs, sums, s


def _split(k: Kernel, u: Reg, parts: int) -> tuple[Reg, Reg]:
    """(block, part) of unit u."""
    return k.op("shr.u32", u, _log2(parts)), k.op("and.b32", u, parts - 1)


class K4(Unit):
    """Q4_K and Q5_K: part p of a super-block is 16 bytes of nibbles, p = 2c + h: its low
    nibbles are values 64c + 16h .. +15 (sub-block 2c), its high ones 64c + 32 + 16h ..
    (sub-block 2c + 1); 6-bit scales and minimums in the 12 bytes after d and dmin (sub-
    blocks 0..3 in the low 6 bits of bytes 0..3 and 4..7, 4..7 in bytes 8..11 with the
    top bits of 0..7). Q5_K's fifth bits: bit i of byte l of qh belongs to value 32 i + l."""

    groups = (16, 16)

    def prepare(self, k, u):
        j, p = _split(k, u, 8)
        c = k.op("shr.u32", p, 1)
        h = k.op("and.b32", p, 1)
        first = k.op("add.u32", k.op("shl.b32", j, 8),
                     k.op("add.u32", k.op("shl.b32", c, 6), k.op("shl.b32", h, 4)))
        byte = k.op("shl.b32", k.op("and.b32", c, 1), 1)
        extra = {"c": c, "h": h,
                 # sub-blocks 4..7 (c >= 2) take the second form of the scales
                 "upper": k.setp("ge.u32", c, 2),
                 "byte": byte,
                 # prmt selectors: bytes byte, byte + 1 of the first word, then of the
                 # second (dot_rows' scales and minimums, a byte each)
                 "pick_two": k.op("mad.lo.u32", byte, 0x1111, 0x5410),
                 "pick_one": k.op("mad.lo.u32", byte, 0x1111, 0x1010)}
        if self.fmt.name == "Q5_K":
            extra["shift"] = k.op("shl.b32", c, 1)
        return Prep(j, p, [(first, 16), (k.op("add.u32", first, 32), 16)], extra)

    def load(self, k, src, n, prep):
        fmt, j = self.fmt, prep.j
        out = {"head": _load(k, src, n, fmt, "head", j, 0, 16, 16),
               "qs": _load(k, src, n, fmt, "qs", j, k.op("shl.b32", prep.p, 4), 16, 16)}
        if fmt.name == "Q5_K":
            out["qh"] = _load(k, src, n, fmt, "qh", j, k.op("shl.b32", prep.extra["h"], 4),
                              16, 16)
        return out

    def _quants(self, k, loaded, prep):
        """The unit's 8 words of quants, a byte each (sub-block 2c's, then 2c + 1's)."""
        low, high = nibbles(k, loaded["qs"])
        if "qh" in loaded:
            shift = prep.extra["shift"]
            low = with_bits(k, low, loaded["qh"], shift, "0x01010101", 4)
            high = with_bits(k, high, loaded["qh"], k.op("add.u32", shift, 1),
                             "0x01010101", 4)
        return low + high

    def x_terms(self, k, xs):
        return int16_x(k, xs, self.groups)

    def dot_rows(self, k, rows, prep, terms, accs):
        """In integers (x as int16_x gives it): each sub-block's sum of u q by dp2a, then
        T = sum of scale * that and M = sum of minimum * sum(q) over the unit's two sub-
        blocks; the row's part is s (d T - dmin M). Exact until the last float steps:
        |T| < 2^31 for 5-bit quants (2 * 16 * 31 * 63 * 32767)."""
        pairs, sums, s = terms
        # Q4_K's high nibbles in place (16 u, no shifts): its sums of u q then 16 times
        # (< 2^31: 16 * 16 * 15 * 32767), exactly, and shifted back once
        in_place = "qh" not in rows[0]
        quants = [[k.op("and.b32", w, LOW_NIBBLES) for w in loaded["qs"]]
                  + [k.op("and.b32", w, "0xF0F0F0F0") for w in loaded["qs"]] if in_place
                  else self._quants(k, loaded, prep) for loaded in rows]
        dots = [[None, None] for _ in rows]
        for w in range(8):  # word by word, every row (see Unit.dot_rows)
            for r, words in enumerate(quants):
                for half, mode in enumerate(("lo", "hi")):  # values 4w.. and 4w + 2..
                    prior = dots[r][w // 4]
                    dots[r][w // 4] = k.op(f"dp2a.{mode}.s32.u32", pairs[2 * w + half],
                                           words[w], 0 if prior is None else prior)
        out = []
        for loaded, (dot_a, dot_b), acc in zip(rows, dots, accs):
            if in_place:
                dot_b = k.op("shr.s32", dot_b, 4)
            scale_a, scale_b, least_a, least_b = self._integer_scales(k, loaded["head"], prep)
            t = k.op("mad.lo.s32", scale_b, dot_b, k.op("mul.lo.s32", scale_a, dot_a))
            m = k.op("mad.lo.s32", least_b, sums[1], k.op("mul.lo.s32", least_a, sums[0]))
            d, dmin = halves_f32(k, loaded["head"][0])
            minimums = k.op("mul.f32", k.op("cvt.rn.f32.s32", m), dmin)
            part = k.op("fma.rn.f32", k.op("cvt.rn.f32.s32", t), d,
                        k.op("neg.f32", minimums))
            out.append(k.op("fma.rn.f32", part, s, acc))
        return out

    def _integer_scales(self, k, head, prep):
        """(scale, scale, minimum, minimum) of sub-blocks 2c and 2c + 1, as integers."""
        _, h1, h2, h3 = head
        x = prep.extra
        # bytes of sub-blocks 2c, 2c + 1: scales (h1), minimums (h2); and h3's for c >= 2
        pair = k.op("prmt.b32", h1, h2, x["pick_two"])
        tops = k.op("prmt.b32", h3, h3, x["pick_one"])
        lower = k.op("and.b32", pair, "0x3F3F3F3F")
        # c >= 2: low 4 bits from h3 (the scale's low nibble, the minimum's high one),
        # top 2 from the high bits of the lower form's bytes
        nib = k.op("or.b32", k.op("and.b32", tops, "0x00000F0F"),
                   k.op("and.b32", k.op("shr.u32", tops, 4), "0x0F0F0000"))
        upper = k.op("or.b32", nib, k.op("and.b32", k.op("shr.u32", pair, 2), "0x30303030"))
        both = k.op("selp.b32", upper, lower, x["upper"])
        return [k.op("prmt.b32", both, 0, 0x4440 + b) for b in range(4)]

    def decode(self, k, loaded, prep):
        words = self._quants(k, loaded, prep)
        low, high = words[:4], words[4:]
        x = prep.extra
        h0, h1, h2, h3 = loaded["head"]
        d, dmin = halves_f32(k, h0)
        six = "0x3F3F3F3F"
        top = "0x30303030"
        # all 8 (scale, min) pairs, a byte each: sub-blocks 0..3, then 4..7
        scales_lo = k.op("and.b32", h1, six)
        mins_lo = k.op("and.b32", h2, six)
        scales_hi = k.op("or.b32", k.op("and.b32", h3, LOW_NIBBLES),
                         k.op("and.b32", k.op("shr.u32", h1, 2), top))
        mins_hi = k.op("or.b32", k.op("and.b32", k.op("shr.u32", h3, 4), LOW_NIBBLES),
                       k.op("and.b32", k.op("shr.u32", h2, 2), top))
        scales = k.op("selp.b32", scales_hi, scales_lo, x["upper"])
        mins = k.op("selp.b32", mins_hi, mins_lo, x["upper"])
        out = []
        for e in range(2):
            byte = k.op("add.u32", x["byte"], e) if e else x["byte"]
            a = k.op("mul.rn.f32", d, small_f32(k, scales, byte))
            b = k.op("neg.f32", k.op("mul.rn.f32", dmin, small_f32(k, mins, byte)))
            out.append(Scale(a, b=b))
        return low + high, out


class Q6K(Unit):
    """Q6_K: part p = 4 n + q of a super-block is ql bytes 64 n + 16 q .. +15: low nibbles
    values 128 n + 16 q .. (scale 8 n + q), high nibbles 128 n + 64 + 16 q .. (scale
    8 n + 4 + q); their top 2 bits from qh bytes 32 n + 16 (q & 1) .., bits 2 (q >> 1) and
    4 + 2 (q >> 1); int8 scales; value d * scale * (u - 32)."""

    groups = (16, 16)

    def prepare(self, k, u):
        j, p = _split(k, u, 8)
        n = k.op("shr.u32", p, 2)
        q = k.op("and.b32", p, 3)
        first = k.op("add.u32", k.op("shl.b32", j, 8),
                     k.op("add.u32", k.op("shl.b32", n, 7), k.op("shl.b32", q, 4)))
        shift = k.op("shl.b32", k.op("shr.u32", q, 1), 1)
        return Prep(j, p, [(first, 16), (k.op("add.u32", first, 64), 16)],
                    {"n": n, "q": q, "shift": shift})

    def load(self, k, src, n_row, prep):
        fmt, j, x = self.fmt, prep.j, prep.extra
        return {"ql": _load(k, src, n_row, fmt, "ql", j,
                            k.op("add.u32", k.op("shl.b32", x["n"], 6), k.op("shl.b32", x["q"], 4)),
                            16, 16),
                "qh": _load(k, src, n_row, fmt, "qh", j,
                            k.op("add.u32", k.op("shl.b32", x["n"], 5),
                                 k.op("shl.b32", k.op("and.b32", x["q"], 1), 4)), 16, 16),
                "scales": _load(k, src, n_row, fmt, "scales", j, k.op("shl.b32", x["n"], 3),
                                8, 8),
                "d": _half(k, src, n_row, fmt, "d", j)}

    def decode(self, k, loaded, prep):
        x = prep.extra
        low, high = nibbles(k, loaded["ql"])
        low = with_bits(k, low, loaded["qh"], x["shift"], "0x03030303", 4)
        high = with_bits(k, high, loaded["qh"], k.op("add.u32", x["shift"], 4), "0x03030303", 4)
        out = []
        for word in loaded["scales"]:  # the low nibbles' scale, then the high ones'
            signed = small_f32(k, k.op("xor.b32", word, "0x80808080"), x["q"], 128)
            out.append(Scale(k.op("mul.rn.f32", loaded["d"], signed), c=32))
        return low + high, out


class K2(Unit):
    """Q2_K and Q3_K: 2-bit quants, each 128 values in 32 bytes (value 128 n + 32 s + l:
    bits 2 s of byte 32 n + l); part p = 4 n + t takes bytes 32 n + 8 t .. +7, values
    128 n + 32 s + 8 t .. +7 for s = 0..3, each 8 in the 16-value group 8 n + 2 s + t/2.
    Q2_K: a byte a group, 4-bit scale and minimum, value d * scale * u - dmin * min.
    Q3_K: the high bit of value 32 i + l is bit i of hmask byte l (u = 2 bits + 4 high);
    6-bit scales (group g: low 4 bits in byte g % 8 from bit 4 (g / 8), top 2 in byte
    8 + g % 4 from bit 2 (g / 4)); value d * (scale - 32) * (u - 4)."""

    groups = (8, 8, 8, 8)

    def prepare(self, k, u):
        j, p = _split(k, u, 8)
        n = k.op("shr.u32", p, 2)
        t = k.op("and.b32", p, 3)
        first = k.op("add.u32", k.op("shl.b32", j, 8),
                     k.op("add.u32", k.op("shl.b32", n, 7), k.op("shl.b32", t, 3)))
        segments = [(k.op("add.u32", first, 32 * s) if s else first, 8) for s in range(4)]
        half = k.op("shr.u32", t, 1)  # the group's place among each pair
        return Prep(j, p, segments, {"n": n, "t": t, "half": half})

    def load(self, k, src, n_row, prep):
        fmt, j, x = self.fmt, prep.j, prep.extra
        out = {"qs": _load(k, src, n_row, fmt, "qs", j,
                           k.op("add.u32", k.op("shl.b32", x["n"], 5), k.op("shl.b32", x["t"], 3)),
                           8, 8)}
        if fmt.name == "Q2_K":
            out["scales"] = _load(k, src, n_row, fmt, "scales", j, k.op("shl.b32", x["n"], 3),
                                  8, 8)
            out["dm"] = _load(k, src, n_row, fmt, "dm", j, 0, 4, 4)[0]
        else:
            out["hmask"] = _load(k, src, n_row, fmt, "hmask", j, k.op("shl.b32", x["t"], 3),
                                 8, 8)
            out["scales"] = _load(k, src, n_row, fmt, "scales", j, 0, 12, 4)
            out["d"] = _half(k, src, n_row, fmt, "d", j)
        return out

    def decode(self, k, loaded, prep):
        x = prep.extra
        words = []
        for s in range(4):
            part = [k.op("and.b32", k.op("shr.u32", w, 2 * s) if s else w, "0x03030303")
                    for w in loaded["qs"]]
            if "hmask" in loaded:
                bit = k.op("add.u32", k.op("shl.b32", x["n"], 2), s)
                part = with_bits(k, part, loaded["hmask"], bit, "0x01010101", 2)
            words += part
        # group 8 n + 2 s + half: byte 2 s + half of the loaded scale bytes 8 n ..
        out = []
        if "dm" in loaded:
            d, dmin = halves_f32(k, loaded["dm"])
            for s in range(4):
                word = loaded["scales"][s >> 1]
                byte = k.op("add.u32", x["half"], 2 * (s & 1))
                scale = small_f32(k, k.op("and.b32", word, LOW_NIBBLES), byte)
                least = small_f32(k, k.op("and.b32", k.op("shr.u32", word, 4), LOW_NIBBLES), byte)
                out.append(Scale(k.op("mul.rn.f32", d, scale),
                                 b=k.op("neg.f32", k.op("mul.rn.f32", dmin, least))))
            return words, out
        low_words, top_word = loaded["scales"][:2], loaded["scales"][2]
        for s in range(4):
            # group g = 8 n + 2 s + half: low bits in byte 2 s + half (bytes 0..7), from bit
            # 4 n; top bits in byte 8 + (2 (s & 1) + half), from bit 4 n + 2 (s >> 1)
            byte_bits = k.op("shl.b32", k.op("add.u32", x["half"], 2 * (s & 1)), 3)
            low_shift = k.op("add.u32", byte_bits, k.op("shl.b32", x["n"], 2))
            top_shift = k.op("add.u32", low_shift, 2 * (s >> 1)) if s >> 1 else low_shift
            low = k.op("and.b32", k.op("shr.u32", low_words[s >> 1], low_shift), 15)
            top = k.op("and.b32", k.op("shr.u32", top_word, top_shift), 3)
            six = k.op("or.b32", low, k.op("shl.b32", top, 4))
            scale = small_f32(k, six, 0, 32)
            out.append(Scale(k.op("mul.rn.f32", loaded["d"], scale), c=4))
        return words, out


def unit(fmt: Format) -> Unit:
    """The unit decoder of a type."""
    if fmt.is_float:
        return Floats(fmt)
    if fmt.name == "Q8_0":
        return Q8_0(fmt)
    if fmt.block_values == 32:
        return Block32(fmt)
    if fmt.name in ("Q4_K", "Q5_K"):
        return K4(fmt)
    if fmt.name == "Q6_K":
        return Q6K(fmt)
    return K2(fmt)
