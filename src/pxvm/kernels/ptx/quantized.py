"""Products with GGUF-quantized weights in PTX: y (M, N) = x (M, K) @ W^T, W as raw GGUF
rows (N, row_bytes), dequantized in registers.

`matvec_q8_0_planes` reads them repacked (`repack_q8_0`) into an int8 plane and a
float16 scale plane, a block of threads a few outputs; it is the one the op launches.
`matvec_q8_0`: the raw Q8_0 blocks (a float16 scale, then 32 int8 values: 34 bytes). A warp
computes rows_per_warp outputs of one x row, output after output, 4 blocks a trip: lane
l takes values 4c .. 4c + 3 (c = l % 8) of block l / 8, so the warp's loads of values and
of x are contiguous; the lanes' sums meet by shuffles. Blocks are 2-byte aligned only,
so values are loaded 16 bits at a time and their bytes taken apart with bfe.
"""

from __future__ import annotations

from .builder import Kernel, f32

THREADS = 256
WARPS = THREADS // 32
Q8_0_BLOCK_BYTES = 34
#: outputs a warp computes, one after another (the op launches ROWS_PER_WARP[0])
ROWS_PER_WARP = (1, 4)
#: groups of 4 blocks whose loads a lane issues before it multiplies
UNROLL = 4
#: (unrolled trips, outputs a warp) of the planes kernel: the ones tried on the H100
PLANES_SHAPES = ((1, 1), (1, 4), (2, 4), (1, 8), (1, 16))


def matvec_q8_0(rows_per_warp: int = 1) -> Kernel:
    """Grid (ceil(N / (WARPS * rows_per_warp)), M): block (x, m) computes outputs
    x * WARPS * rows_per_warp .. of x row m."""
    k = Kernel(f"matvec_q8_0_r{rows_per_warp}",
               [("x", "u64"), ("w", "u64"), ("y", "u64"), ("N", "u32"), ("K", "u32"),
                ("row_bytes", "u32")])
    x, w, y, N, K, row_bytes = k.params()
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    m = k.special("%ctaid.y")
    first = k.op("mul.lo.u32", k.op("mad.lo.u32", k.special("%ctaid.x"), WARPS, warp),
                 rows_per_warp)
    blocks = k.op("shr.u32", K, 5)
    # lane l reads values 4c .. 4c + 3 (c = l % 8) of block l / 8 of each group of 4
    quarter = k.op("and.b32", lane, 7)
    x_lane = k.element(x, k.op("mad.lo.u32", m, K, k.op("shl.b32", lane, 2)), 4)
    for r in range(rows_per_warp):
        n = k.op("add.u32", first, r)
        with k.if_(k.setp("lt.u32", n, N)):
            row = k.op("add.u64", w, k.op("mul.wide.u32", n, row_bytes))
            acc = k.op("mov.f32", f32(0.0))
            b = k.op("shr.u32", lane, 3)  # this lane's block of the group
            xs = k.op("mov.u64", x_lane)
            with k.loop(b, blocks, 4 * UNROLL):
                # UNROLL groups' loads first (more bytes in flight), then their products;
                # groups past the row's end read nothing and add 0
                loaded = []
                for u in range(UNROLL):
                    bu = k.op("add.u32", b, 4 * u)
                    ok = k.setp("lt.u32", bu, blocks)
                    block = k.op("add.u64", row, k.op("mul.wide.u32", bu, Q8_0_BLOCK_BYTES))
                    scale16 = k.reg("b16")
                    k.to(scale16, "mov.b16", 0)
                    k.to(scale16, "ld.global.b16", f"[{block}]", pred=ok)
                    values = k.op("add.u64", block, k.op("mul.wide.u32", quarter, 4))
                    halves = []
                    for h in range(2):
                        half = k.reg("u16")
                        k.to(half, "mov.u16", 0)
                        k.to(half, "ld.global.u16", f"[{values}+{2 + 2 * h}]", pred=ok)
                        halves.append(half)
                    xv = [k.reg("f32") for _ in range(4)]
                    for v in xv:
                        k.to(v, "mov.f32", f32(0.0))
                    k.emit(f"@{ok} ld.global.v4.f32 {{{', '.join(map(str, xv))}}}, "
                           f"[{xs}+{512 * u}]")
                    loaded.append((scale16, halves, xv))
                for scale16, halves, xv in loaded:
                    part = k.op("mov.f32", f32(0.0))
                    for h, half in enumerate(halves):
                        pair = k.op("cvt.u32.u16", half)
                        for e in range(2):
                            value = k.op("cvt.rn.f32.s32", k.op("bfe.s32", pair, 8 * e, 8))
                            k.to(part, "fma.rn.f32", value, xv[2 * h + e], part)
                    k.to(acc, "fma.rn.f32", part, k.op("cvt.f32.f16", scale16), acc)
                k.to(xs, "add.u64", xs, 512 * UNROLL)  # 4 * UNROLL blocks of 32 values
            for offset in (16, 8, 4, 2, 1):
                k.to(acc, "add.f32", acc,
                     k.op("shfl.sync.bfly.b32", acc, offset, "0x1f", "0xffffffff"))
            with k.if_(k.setp("eq.u32", lane, 0)):
                k.store("f32", k.element(y, k.op("mad.lo.u32", m, N, n), 4), acc)
    return k


def repack_q8_0() -> Kernel:
    """Q8_0 rows (N, row_bytes) into planes the products read with 16-byte loads: the
    int8 values (N, K), then the float16 scales (N, K / 32). A thread a block."""
    k = Kernel("repack_q8_0", [("w", "u64"), ("out", "u64"), ("blocks", "u32"),
                               ("per_row", "u32"), ("row_bytes", "u32"), ("scales", "u32")])
    w, out, blocks, per_row, row_bytes, scales = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, blocks, stride):
        n = k.op("div.u32", i, per_row)
        j = k.op("rem.u32", i, per_row)
        block = k.op("add.u64", w, k.op("add.u64", k.op("mul.wide.u32", n, row_bytes),
                                         k.op("mul.wide.u32", j, Q8_0_BLOCK_BYTES)))
        k.store("b16", k.op("add.u64", out, k.op("mul.wide.u32",
                                                   k.op("add.u32", scales, i), 2)),
                k.load("b16", block))
        values = k.element(out, k.op("mul.lo.u32", i, 8), 4)  # 32 bytes a block
        for q in range(8):
            lo = k.op("cvt.u32.u16", k.load("u16", f"{block}+{2 + 4 * q}"))
            hi = k.op("cvt.u32.u16", k.load("u16", f"{block}+{4 + 4 * q}"))
            k.store("b32", f"{values}+{4 * q}", k.op("prmt.b32", lo, hi, "0x5410"))
    return k


def matvec_q8_0_planes(unroll: int = 1, rows: int = 4) -> Kernel:
    """y (M, N) = x @ W^T for W as repack_q8_0's planes (values at w, scales at w +
    N * K): a block computes `rows` outputs together, its THREADS threads taking a row's
    16-value groups in turn (one 16-byte load and a scale per row, x's 16 values loaded
    once for all the rows: x is most of what passes through L1, so fewer x loads per
    weight byte is what frees it), `unroll` trips' loads issued before their products;
    the threads' sums meet by shuffles, then across warps in shared memory."""
    k = Kernel(f"matvec_q8_0_planes_u{unroll}_r{rows}",
               [("x", "u64"), ("w", "u64"), ("y", "u64"), ("N", "u32"), ("K", "u32")])
    x, w, y, N, K = k.params()
    partial = k.op("mov.u32", k.shared("partial", "f32", WARPS * rows, 16))
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    first = k.op("mul.lo.u32", k.special("%ctaid.x"), rows)
    m = k.special("%ctaid.y")
    groups = k.op("shr.u32", K, 4)  # 16-value groups of a row
    # rows past N read the last row again (and are not stored)
    last = k.op("sub.u32", N, 1)
    ns = [k.op("min.u32", k.op("add.u32", first, r), last) for r in range(rows)]
    values = [k.op("add.u64", w, k.op("mul.wide.u32", n, K)) for n in ns]
    scale_plane = k.op("add.u64", w, k.op("mul.wide.u32", N, K))
    per_row = k.op("shr.u32", K, 5)
    scales = [k.op("add.u64", scale_plane,
                   k.op("mul.wide.u32", k.op("mul.lo.u32", n, per_row), 2)) for n in ns]
    x_row = k.element(x, k.op("mul.lo.u32", m, K), 4)
    acc = [k.op("mov.f32", f32(0.0)) for _ in range(rows)]
    g = k.op("mov.u32", tid)
    with k.loop(g, groups, THREADS * unroll):
        loaded = []
        for u in range(unroll):
            gu = k.op("add.u32", g, THREADS * u)
            ok = k.setp("lt.u32", gu, groups)
            xv = [k.reg("f32") for _ in range(16)]
            for r in xv:
                k.to(r, "mov.f32", f32(0.0))
            xs = k.op("add.u64", x_row, k.op("mul.wide.u32", gu, 64))
            for q in range(4):
                k.emit(f"@{ok} ld.global.v4.f32 {{{', '.join(map(str, xv[4 * q:4 * q + 4]))}}}, "
                       f"[{xs}+{16 * q}]")
            offset = k.op("mul.wide.u32", gu, 16)
            scale_offset = k.op("mul.wide.u32", k.op("shr.u32", gu, 1), 2)
            per_rows = []
            for r in range(rows):
                words = [k.reg("b32") for _ in range(4)]
                scale = k.reg("b16")
                for word in words:
                    k.to(word, "mov.b32", 0)
                k.to(scale, "mov.b16", 0)
                k.emit(f"@{ok} ld.global.nc.v4.b32 {{{', '.join(map(str, words))}}}, "
                       f"[{k.op('add.u64', values[r], offset)}]")
                k.to(scale, "ld.global.nc.b16",
                     f"[{k.op('add.u64', scales[r], scale_offset)}]", pred=ok)
                per_rows.append((words, scale))
            loaded.append((xv, per_rows))
        for xv, per_rows in loaded:
            for r, (words, scale) in enumerate(per_rows):
                part = k.op("mov.f32", f32(0.0))
                for q, word in enumerate(words):
                    for e in range(4):
                        value = k.op("cvt.rn.f32.s32", k.op("bfe.s32", word, 8 * e, 8))
                        k.to(part, "fma.rn.f32", value, xv[4 * q + e], part)
                k.to(acc[r], "fma.rn.f32", part, k.op("cvt.f32.f16", scale), acc[r])
    for r in range(rows):
        for offset in (16, 8, 4, 2, 1):
            k.to(acc[r], "add.f32", acc[r], k.op("shfl.sync.bfly.b32", acc[r], offset,
                                                  "0x1f", "0xffffffff"))
        with k.if_(k.setp("eq.u32", lane, 0)):
            k.store("f32", k.op("mad.lo.u32", k.op("mad.lo.u32", warp, rows, r), 4, partial),
                    acc[r], space="shared")
    k.emit("bar.sync 0")
    with k.if_(k.setp("lt.u32", tid, rows)):  # thread r sums row r's warps
        total = k.op("mov.f32", f32(0.0))
        for v in range(WARPS):
            k.to(total, "add.f32", total, k.load(
                "f32", k.op("mad.lo.u32", k.op("add.u32", tid, v * rows), 4, partial),
                space="shared"))
        n = k.op("add.u32", first, tid)
        with k.if_(k.setp("lt.u32", n, N)):
            k.store("f32", k.element(y, k.op("mad.lo.u32", m, N, n), 4), total)
    return k


def variants():
    for rows in ROWS_PER_WARP:
        yield matvec_q8_0, (rows,)
    yield repack_q8_0, ()
    for unroll, rows in PLANES_SHAPES:
        yield matvec_q8_0_planes, (unroll, rows)
