"""Products with GGUF-quantized weights in PTX: y (M, N) = x (M, K) @ W^T, W as GGUF rows
(N, row_bytes) of any type pxvm reads, decoded in registers (quant_blocks.py: the units
of 32 values a thread reads, and how each type's are decoded).

`matvec`: a block of threads computes `rows` outputs of one x row (grid (N / rows, M)).
Thread t takes units t, t + threads, .. of the row: it loads their x values (and their
sums by scale group) once for all its rows, then the unit of each of its rows, `group`
rows loaded and multiplied together (value by value across the rows, so that all their
loads are needed from the start). The threads' sums meet by shuffles, all the rows
together (each exchange halves the values a lane holds), then across warps in shared
memory. A block has a thread a unit of a row (in whole warps) up to MAX_THREADS, beyond
that several passes with the units spread evenly. So that the loads of all the rows are
in flight at once whatever ptxas's schedule, the block first asks L2 for its rows
(`prefetch`). Types whose blocks are not 16-byte aligned are read repacked into planes
(`repack`, once per weight; the op keeps them).

`matvec_float_scalar`: F32, F16, BF16 weights whose K is not a multiple of 32 (their rows
are not 16-byte aligned): a warp an output, a value a lane at a time.
"""

from __future__ import annotations

from math import gcd

from .builder import Kernel, f32
from .quant_blocks import (FORMATS, UNIT, Planes, bulk_prefetch, load_half, load_words, source,
                           store_words, unit)

THREADS = 256
WARPS = THREADS // 32
#: threads of a matvec block at most: with up to 255 registers a thread, a block of 256
#: still fits a multiprocessor's 65,536 (the launch fails beyond)
MAX_THREADS = 256
#: warps a block can have (the shared partial sums are sized for any block)
MAX_WARPS = 32
#: (outputs a block, rows a group) of `matvec`: the shapes the H100 benchmark sweeps
SHAPES = ((4, 4), (8, 4), (8, 8), (16, 8), (16, 16))
#: the shape every type has (the op launches it unless told otherwise)
DEFAULT_SHAPE = (8, 8)
#: how `matvec` asks for its weights ahead of the loads: "bulk" (Hopper's bulk prefetch:
#: one instruction a plane asks L2 for all the block's rows as the block starts; the
#: module's target is then sm_90a, as wgmma's), "lines" (each thread prefetches its
#: units' lines to L2 before loading them), "none"
PREFETCHES = ("bulk", "lines", "none")
#: the types whose SHAPES are all emitted (the ones benchmarked): Q4_K, Q8_0, Q4_0, Q6_K,
#: Q5_K
SWEPT = (12, 8, 2, 14, 13)
FLOAT_BYTES = {0: 4, 1: 2, 30: 2}


def threads_for(k: int) -> int:
    """Threads of a matvec block for rows of k values: a unit each in one pass where
    MAX_THREADS allow, else as few passes as they allow with the units spread evenly over
    them; in whole warps."""
    units = k // UNIT
    passes = max(1, -(-units // MAX_THREADS))
    return max(32, -(-units // (32 * passes)) * 32)


def _pairwise_sum(k: Kernel, values):
    values = list(values)
    while len(values) > 1:
        values = [k.op("add.f32", values[i], values[i + 1]) if i + 1 < len(values)
                  else values[i] for i in range(0, len(values), 2)]
    return values[0]


def _shuffle(k: Kernel, value, offset: int):
    return k.op("shfl.sync.bfly.b32", value, offset, "0x1f", "0xffffffff")


def _warp_sums(k: Kernel, acc: list, lane, warp, partial, rows: int) -> None:
    """Each warp's sums of `acc` (one value a row) into partial[warp * rows + row]. The
    first log2(rows) exchanges halve the values a lane holds (it keeps one of each pair,
    sends the other), the rest add whole: lane l ends with the sum of row r(l), bit s of
    r(l) being bit 4 - s of l."""
    values = list(acc)
    offset = 16
    while len(values) > 1:
        upper = k.setp("ne.u32", k.op("and.b32", lane, offset), 0)
        halved = []
        for a, b in zip(values[::2], values[1::2]):
            send = k.op("selp.f32", a, b, upper)
            keep = k.op("selp.f32", b, a, upper)
            halved.append(k.op("add.f32", keep, _shuffle(k, send, offset)))
        values = halved
        offset //= 2
    total = values[0]
    while offset:
        total = k.op("add.f32", total, _shuffle(k, total, offset))
        offset //= 2
    levels = rows.bit_length() - 1
    row = 0
    for s in range(levels):
        bit = k.op("and.b32", k.op("shr.u32", lane, 4 - s), 1)
        row = k.op("or.b32", row, k.op("shl.b32", bit, s)) if s else bit
    writer = k.setp("eq.u32", k.op("and.b32", lane, (1 << (5 - levels)) - 1), 0)
    with k.if_(writer):
        slot = k.op("mad.lo.u32", warp, rows, row)
        k.store("f32", k.op("mad.lo.u32", slot, 4, partial), total, space="shared")


def matvec(code: int, rows: int = 8, group: int = 8, prefetch: str = "bulk") -> Kernel:
    """Grid (ceil(N / rows), M), block threads_for(K): block (b, m) computes outputs
    b * rows .. of x row m. Parameters: x, the weight (one pointer, or a plane a field
    for the repacked types), y, N, K. `prefetch`: PREFETCHES (ptxas moves each load
    down to its first use where registers are short, so that loads issued together in
    the PTX do not stay together; prefetches put the bytes in L2 ahead of them)."""
    if rows & (rows - 1) or rows > 32 or rows % group:
        raise ValueError(f"rows must be a power of two <= 32 and a multiple of group, "
                         f"got {rows}, {group}")
    fmt = FORMATS[code]
    reader = unit(fmt)
    src = source(fmt, fmt.planes)
    k = Kernel(f"matvec_{fmt.label}_r{rows}_g{group}_{prefetch}",
               [("x", "u64"), *src.params(), ("y", "u64"), ("N", "u32"), ("K", "u32")],
               arch="sm_90a" if prefetch == "bulk" else None)
    x, *pointers, y, N, K = k.params()
    src.bind(k, pointers, K)
    partial = k.op("mov.u32", k.shared("partial", "f32", MAX_WARPS * rows, 16))
    tid = k.special("%tid.x")
    threads = k.special("%ntid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    first = k.op("mul.lo.u32", k.special("%ctaid.x"), rows)
    m = k.special("%ctaid.y")
    # rows past N read the last row again (and are not stored)
    last = k.op("sub.u32", N, 1)
    ns = [k.op("min.u32", k.op("add.u32", first, r), last) for r in range(rows)]
    x_row = k.element(x, k.op("mul.lo.u32", m, K), 4)
    units = k.op("shr.u32", K, 5)
    acc = [k.op("mov.f32", f32(0.0)) for _ in range(rows)]
    if prefetch == "bulk":  # one thread asks for every row of the block
        with k.if_(k.setp("eq.u32", tid, 0)):
            count = k.op("sub.u32", k.op("min.u32", k.op("add.u32", first, rows), N), first)
            for address, nbytes in src.spans(k, first, count):
                bulk_prefetch(k, address, nbytes)
    u = k.op("mov.u32", tid)
    with k.loop(u, units, threads):
        prep = reader.prepare(k, u)
        if prefetch == "lines":
            src.prefetching = True
            for n in ns:
                reader.load(k, src, n, prep)
            src.prefetching = False

        def loads(g):
            return [reader.load(k, src, ns[r], prep) for r in range(g * group, (g + 1) * group)]

        pending = loads(0)  # the weights first: their loads take longest
        xs = []
        for start, count in prep.segments:
            address = k.element(x_row, start, 4)
            for q in range(count // 4):
                regs = [k.reg("f32") for _ in range(4)]
                k.emit(f"ld.global.v4.f32 {{{', '.join(map(str, regs))}}}, [{address}+{16 * q}]")
                xs += regs
        sums, v = [], 0
        for count in reader.groups or ():
            sums.append(_pairwise_sum(k, xs[v:v + count]))
            v += count
        groups = rows // group
        for g in range(groups):
            following = loads(g + 1) if g + 1 < groups else None
            these = acc[g * group:(g + 1) * group]
            for a, total in zip(these, reader.dot_rows(k, pending, prep, xs, sums, these)):
                k.to(a, "mov.f32", total)
            pending = following
    _warp_sums(k, acc, lane, warp, partial, rows)
    k.emit("bar.sync 0")
    with k.if_(k.setp("lt.u32", tid, rows)):  # thread r adds row r's warps
        total = k.op("mov.f32", f32(0.0))
        warps = k.op("shr.u32", threads, 5)
        w = k.op("mov.u32", 0)
        with k.loop(w, warps, 1):
            slot = k.op("mad.lo.u32", w, rows, tid)
            k.to(total, "add.f32", total,
                 k.load("f32", k.op("mad.lo.u32", slot, 4, partial), space="shared"))
        n = k.op("add.u32", first, tid)
        with k.if_(k.setp("lt.u32", n, N)):
            k.store("f32", k.element(y, k.op("mad.lo.u32", m, N, n), 4), total)
    return k


def float_value(k: Kernel, code: int, address) -> object:
    """The float32 value of one F32, F16 or BF16 element at `address`."""
    if code == 0:
        return k.load("f32", address, "global.nc")
    half = k.load("b16", address, "global.nc")
    if code == 1:
        return k.op("cvt.f32.f16", half)
    bits = k.op("shl.b32", k.op("cvt.u32.u16", half), 16)  # BF16: a float32's high half
    value = k.reg("f32")
    k.emit(f"mov.b32 {value}, {bits}")
    return value


def matvec_float_scalar(code: int) -> Kernel:
    """Grid (ceil(N / WARPS), M), THREADS threads: warp w of block (b, m) computes output
    b * WARPS + w of x row m."""
    fmt = FORMATS[code]
    size = FLOAT_BYTES[code]
    k = Kernel(f"matvec_{fmt.label}_scalar",
               [("x", "u64"), ("w", "u64"), ("y", "u64"), ("N", "u32"), ("K", "u32")])
    x, w, y, N, K = k.params()
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    n = k.op("mad.lo.u32", k.special("%ctaid.x"), WARPS, k.op("shr.u32", tid, 5))
    m = k.special("%ctaid.y")
    with k.if_(k.setp("lt.u32", n, N)):  # a whole warp or none
        row = k.op("add.u64", w, k.op("mul.wide.u32", n, k.op("mul.lo.u32", K, size)))
        x_row = k.element(x, k.op("mul.lo.u32", m, K), 4)
        acc = k.op("mov.f32", f32(0.0))
        i = k.op("mov.u32", lane)
        with k.loop(i, K, 32):
            value = float_value(k, code, k.element(row, i, size))
            k.to(acc, "fma.rn.f32", value, k.load("f32", k.element(x_row, i, 4)), acc)
        for offset in (16, 8, 4, 2, 1):
            k.to(acc, "add.f32", acc, _shuffle(k, acc, offset))
        with k.if_(k.setp("eq.u32", lane, 0)):
            k.store("f32", k.element(y, k.op("mad.lo.u32", m, N, n), 4), acc)
    return k


def repack(code: int) -> Kernel:
    """GGUF rows into one plane a field (quant_blocks.Planes): block i's field f at
    plane_f + i * size_f. A thread a block, grid-stride; parameters w, the planes,
    blocks (N * blocks a row)."""
    fmt = FORMATS[code]
    k = Kernel(f"repack_{fmt.label}",
               [("w", "u64"), *Planes(fmt).params(), ("blocks", "u32")])
    w, *planes, blocks = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, blocks, stride):
        block = k.op("add.u64", w, k.op("mul.wide.u32", i, fmt.block_bytes))
        for field, plane in zip(fmt.fields, planes):
            at = k.op("add.u64", block, field.offset)
            to = k.op("add.u64", plane, k.op("mul.wide.u32", i, field.size))
            if field.size == 2:
                k.store("b16", to, load_half(k, at, "ld.global.nc"))
                continue
            words = load_words(k, at, field.size, gcd(fmt.block_bytes, field.offset, 16),
                               "ld.global.nc")
            store_words(k, to, words, gcd(field.size, 16))
    return k


def variants():
    for code, fmt in FORMATS.items():
        for prefetch in PREFETCHES:
            shapes = SHAPES if code in SWEPT and prefetch != "lines" else (DEFAULT_SHAPE,)
            for rows, group in shapes:
                yield matvec, (code, rows, group, prefetch)
        if fmt.planes:
            yield repack, (code,)
        if fmt.is_float:
            yield matvec_float_scalar, (code,)
