"""Products with GGUF-quantized weights in PTX: y (M, N) = x (M, K) @ W^T, W as raw GGUF
rows (N, row_bytes), dequantized in registers.

`matvec_q8_0`: Q8_0 blocks (a float16 scale, then 32 int8 values: 34 bytes). A warp
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


def variants():
    for rows in ROWS_PER_WARP:
        yield matvec_q8_0, (rows,)
