"""Attention in PTX: out (Sq, Hq, D) float32 = softmax(q k^T * scale + mask) v per query
head, for q (Sq, Hq, D) and k, v (Skv, Hkv, D); query head h reads key/value head
h / (Hq / Hkv); query i sees keys j < `limit` = min(Skv, i + offset + 1) (causal:
offset = Skv - Sq; without the mask an offset of Skv lets every query see every key).

`flash_f16`: float16 q, k, v on tensor cores with float32 accumulation, FlashAttention-2's
way. A block of `warps` warps takes 16 * warps queries of one head, 16 a warp (one m16
tile), and walks the keys in tiles of `block_n` through shared memory. Q's fragments
stay in registers; S = Q K^T (mma.sync m16n8k16, K's fragments by ldmatrix) stays in the
accumulators, where the online softmax works on it: a thread holds values of two rows,
whose max the 4 threads sharing the rows meet by shuffles; p = 2^(s * scale log2 e - m
* scale log2 e), one fma and ex2.approx; the row sums stay per thread until the end. P,
converted to float16 in place, is the A operand of O += P V (an m16n8 accumulator pair is
an A fragment pair), V's fragments by ldmatrix.trans. Loads overlap the products, two
stages of one buffer each: V of a tile is copied (cp.async) while Q K^T of the tile
runs, K of the next tile while P V runs (Q passes through V's buffer first). With 64
keys of 128 values that is 32 KB of static shared memory a block, and 168 registers a
thread (ptxas 13.0, sm_90): 3 blocks a multiprocessor. Only tiles crossing the causal
diagonal or the keys' end are masked; tiles past the diagonal are not visited. Blocks of
query heads that share a key/value head are adjacent in the grid (grid.x = query heads),
so they read the same K and V tiles at about the same time, from L2; grid.y runs the
query tiles with the most keys first.
Shared rows are D values (D / 8 chunks of 16 bytes); chunk c of row r is stored at
c ^ (r & 7), so the 8 rows an ldmatrix reads fall in 8 different bank groups.

`attention_f32`: the float32 op, a warp per (query, head): lane l scores key start + l
of each 32 (a dot product over D against the warp's query row in shared memory), the
warp's max and the online softmax by shuffles, then each lane adds p_j v_j for its
`dims_per_lane` output values (dimensions l, l + 32, ..).
"""

from __future__ import annotations

import math

from .builder import Kernel, Reg, f32

#: (head dimension, keys a tile, warps a block) of the tensor-core kernel: the variants,
#: and the one the op launches for each head dimension (first guesses, to be set from
#: benchmarks/cuda/attention.py --shape on the H100)
SHAPES = ((64, 64, 4), (64, 128, 4), (64, 64, 8), (128, 32, 4), (128, 64, 4), (128, 64, 8))
DEFAULT = {64: (64, 128, 4), 128: (128, 64, 4)}
WARPS = 4                   # attention_f32's warps a block
THREADS = 32 * WARPS
MAX_HEAD_DIM = 256          # attention_f32: a lane's values are lane + 32 r, r < 8
LOG2E = 1.0 / math.log(2.0)
NEG_INF = "0fFF800000"


def _mma(k: Kernel, d: list[Reg], a: list[Reg], b: list[Reg], c: list) -> None:
    k.emit(f"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{', '.join(map(str, d))}}}, "
           f"{{{', '.join(map(str, a))}}}, {{{', '.join(map(str, b))}}}, "
           f"{{{', '.join(map(str, c))}}}")


def _ldmatrix(k: Kernel, address: str, trans: bool = False) -> list[Reg]:
    regs = [k.reg("b32") for _ in range(4)]
    k.emit(f"ldmatrix.sync.aligned.m8n8.x4{'.trans' if trans else ''}.shared.b16 "
           f"{{{', '.join(map(str, regs))}}}, [{address}]")
    return regs


def _quad_reduce(k: Kernel, value: Reg, instr: str) -> Reg:
    """`instr` of `value` over the 4 lanes holding one accumulator row (lane / 4 alike)."""
    for offset in (1, 2):
        value = k.op(instr, value, k.op("shfl.sync.bfly.b32", value, offset, "0x1f",
                                        "0xffffffff"))
    return value


class _TileCopy:
    """cp.async of a tile of `rows` rows of D float16 values of one head, rows first_row
    .. of a (rows, heads, D) tensor, into a shared buffer (chunks swizzled); rows at or
    past `limit` are zeros. A thread copies chunk tid % (D / 8) of rows tid / (D / 8) +
    pass * rows_per_pass: consecutive threads read consecutive bytes of a row. K and V
    share one (their shapes are the same)."""

    def __init__(self, k: Kernel, heads: Reg, head: Reg, head_dim: int, rows: int, tid: Reg,
                 threads: int):
        self.k, self.rows = k, rows
        chunks = head_dim // 8
        self.rows_per_pass = threads // chunks
        self.row_bytes = head_dim * 2
        self.first = k.op("div.u32", tid, chunks)
        chunk = k.op("rem.u32", tid, chunks)
        # passes are rows_per_pass (a multiple of 8) rows apart: the same swizzle for all
        swizzled = k.op("xor.b32", chunk, k.op("and.b32", self.first, 7))
        self.shared_offset = k.op("mad.lo.u32", self.first, self.row_bytes,
                                  k.op("shl.b32", swizzled, 4))
        global_row = k.op("mul.lo.u32", heads, head_dim * 2)  # bytes between rows
        self.global_row = k.op("cvt.u64.u32", global_row)
        self.pass_bytes = k.op("mul.wide.u32", global_row, self.rows_per_pass)
        within = k.op("mad.lo.u32", self.first, global_row,
                      k.op("mad.lo.u32", head, head_dim * 2, k.op("shl.b32", chunk, 4)))
        self.thread_offset = k.op("cvt.u64.u32", within)

    def copy(self, tensor: Reg, first_row: Reg, limit: Reg, buffer: Reg) -> None:
        k = self.k
        source = k.op("mad.lo.u64", k.op("cvt.u64.u32", first_row), self.global_row,
                      k.op("add.u64", tensor, self.thread_offset))
        left = k.op("sub.s32", limit, k.op("add.u32", first_row, self.first))
        dst = k.op("add.u32", buffer, self.shared_offset)
        for p in range(self.rows // self.rows_per_pass):
            if p:
                source = k.op("add.u64", source, self.pass_bytes)
            ok = k.setp("gt.s32", left, p * self.rows_per_pass)
            size = k.op("selp.u32", 16, 0, ok)
            # an address inside the tensor even when nothing is read (size 0)
            safe = k.op("selp.b64", source, tensor, ok)
            k.emit(f"cp.async.cg.shared.global [{dst}+{p * self.rows_per_pass * self.row_bytes}], "
                   f"[{safe}], 16, {size}")


def flash_rows(warps: int) -> int:
    """Queries of a block of the tensor-core kernel."""
    return 16 * warps


def flash_f16(head_dim: int = 128, block_n: int = 64, warps: int = 4,
              positioned: bool = False, half_out: bool = False) -> Kernel:
    """Grid (Hq, ceil(Sq / flash_rows(warps))), 32 * warps threads; module docstring.
    `positioned`: the queries are a prompt's new tokens at position pos = state[1] (read
    on the device) of a KV cache: Skv = pos + Sq keys, causal (offset pos); so that one
    captured launch serves any position (pxvm.llm.prompts). `half_out`: out in float16
    (what the prompt's output projection reads)."""
    D, BN, BM = head_dim, block_n, flash_rows(warps)
    threads = 32 * warps
    row_bytes = D * 2
    where = [("state", "u64")] if positioned else [("skv", "u32")]
    k = Kernel(f"attention_f16_d{D}_n{BN}_w{warps}{'_positioned' if positioned else ''}"
               f"{'_f16' if half_out else ''}",
               [("q", "u64"), ("k", "u64"), ("v", "u64"), ("out", "u64"), ("sq", "u32"),
                *where, ("hq", "u32"), ("hkv", "u32"),
                *([] if positioned else [("offset", "u32")]), ("scale_log2", "f32")])
    if positioned:
        q, keys, values, out, sq, state, hq, hkv, scale_log2 = k.params()
        offset = k.load("u32", f"{state}+4")
        skv = k.op("add.u32", offset, sq)
    else:
        q, keys, values, out, sq, skv, hq, hkv, offset, scale_log2 = k.params()
    k_buffer = k.op("mov.u32", k.shared("k_tile", "b8", BN * row_bytes, 128))
    # V's tile; Q's before the loop
    v_buffer = k.op("mov.u32", k.shared("v_tile", "b8", max(BN, BM) * row_bytes, 128))
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    head = k.special("%ctaid.x")
    kv_head = k.op("div.u32", head, k.op("div.u32", hq, hkv))

    def first_query() -> Reg:
        """The block's first query: the grid's last query tiles (the most keys) first."""
        tile = k.op("sub.u32", k.op("sub.u32", k.special("%nctaid.y"), 1),
                    k.special("%ctaid.y"))
        return k.op("mul.lo.u32", tile, BM)

    def accumulator_rows() -> tuple[list[Reg], Reg]:
        """This thread's accumulator rows, g and g + 8 of its warp's 16 queries (g = lane
        / 4), and its column pair 2 t (t = lane % 4) of each n8 tile: made where used,
        fewer registers live through the loop."""
        lane = k.op("and.b32", k.special("%tid.x"), 31)
        first = k.op("add.u32", first_query(),
                     k.op("shl.b32", k.op("shr.u32", k.special("%tid.x"), 5), 4))
        group = k.op("shr.u32", lane, 2)
        pair = k.op("shl.b32", k.op("and.b32", lane, 3), 1)
        return [k.op("add.u32", first, k.op("add.u32", group, 8 * r)) for r in range(2)], pair

    q0 = first_query()
    # keys any row of the block sees, and the tiles that need no mask (for every row)
    last_row = k.op("min.u32", k.op("add.u32", q0, BM), sq)  # (one past it)
    n_keys = k.op("min.u32", skv, k.op("add.u32", last_row, offset))
    n_tiles = k.op("div.u32", k.op("add.u32", n_keys, BN - 1), BN)
    first_row_keys = k.op("add.u32", k.op("add.u32", q0, offset), 1)
    full_tiles = k.op("min.u32", k.op("div.u32", first_row_keys, BN), k.op("div.u32", skv, BN))

    kv_copy = _TileCopy(k, hkv, kv_head, D, BN, tid, threads)
    zero = k.op("mov.u32", 0)
    _TileCopy(k, hq, head, D, BM, tid, threads).copy(q, q0, sq, v_buffer)
    kv_copy.copy(keys, zero, skv, k_buffer)
    k.emit("cp.async.commit_group")
    k.emit("cp.async.wait_group 0")
    k.emit("bar.sync 0")

    # ldmatrix: lane l addresses row l % 8 of matrix l / 8. A fragments (Q) and V's
    # (transposed) take matrices (rows 0-7, chunk 0), (8-15, 0), (0-7, 1), (8-15, 1) of
    # a 16 x 16 block; K's (rows: keys) (0-7, 0), (0-7, 1), (8-15, 0), (8-15, 1).
    matrix = k.op("shr.u32", lane, 3)
    in_matrix = k.op("and.b32", lane, 7)
    low, high = k.op("and.b32", matrix, 1), k.op("shr.u32", matrix, 1)

    def lane_rows(first_row: Reg, eight: Reg) -> Reg:
        """Byte offset of the lane's row: first_row + 8 eight + l % 8."""
        row = k.op("add.u32", first_row, k.op("mad.lo.u32", eight, 8, in_matrix))
        return k.op("mul.lo.u32", row, row_bytes)

    def chunk_bytes(chunk_bit: Reg) -> Reg:
        # the lane's chunk 2 s + chunk_bit, swizzled: ((2 s + bit) ^ row % 8) * 16, that
        # is (bit ^ row % 8) * 16 ^ 32 s
        return k.op("shl.b32", k.op("xor.b32", chunk_bit, in_matrix), 4)

    def columns(base: Reg, x16: Reg) -> list[Reg]:
        """The lane's addresses of each 16-value column step s (made where used: fewer
        registers live through the loop)."""
        return [k.op("add.u32", base, k.op("xor.b32", x16, 32 * s)) for s in range(D // 16)]

    q_rows = k.op("add.u32", v_buffer, lane_rows(k.op("shl.b32", warp, 4), low))
    q_frags = [_ldmatrix(k, str(a)) for a in columns(q_rows, chunk_bytes(high))]
    k_rows, k_x16 = k.op("add.u32", k_buffer, lane_rows(zero, high)), chunk_bytes(low)
    v_rows, v_x16 = k.op("add.u32", v_buffer, lane_rows(zero, low)), chunk_bytes(high)

    o = [[k.op("mov.f32", f32(0.0)) for _ in range(4)] for _ in range(D // 8)]
    m = [k.op("mov.f32", NEG_INF) for _ in range(2)]   # running max of the raw scores
    l = [k.op("mov.f32", f32(0.0)) for _ in range(2)]  # this thread's part of the sums
    zeros = [k.op("mov.f32", f32(0.0))] * 4

    j = k.op("mov.u32", 0)
    with k.loop(j, n_tiles, 1):
        key0 = k.op("mul.lo.u32", j, BN)
        k.emit("cp.async.wait_group 0")  # K of this tile (copied during the last P V)
        k.emit("bar.sync 0")             # .. for all; and every warp is done with V's buffer
        kv_copy.copy(values, key0, skv, v_buffer)
        k.emit("cp.async.commit_group")

        s = [[k.reg("f32") for _ in range(4)] for _ in range(BN // 8)]
        k_columns = columns(k_rows, k_x16)
        for step, a in enumerate(q_frags):
            for p in range(BN // 16):
                b = _ldmatrix(k, f"{k_columns[step]}+{p * 16 * row_bytes}")
                for half in range(2):
                    acc = s[2 * p + half]
                    _mma(k, acc, a, b[2 * half:2 * half + 2], zeros if step == 0 else acc)
        with k.if_(k.setp("ge.u32", j, full_tiles)):
            rows, pair = accumulator_rows()
            for r in range(2):
                # row r sees keys below min(Skv, row + offset + 1): key 8 n + e of the
                # thread's pair in this tile where 8 n + e < left
                limit = k.op("min.u32", skv,
                             k.op("add.u32", k.op("add.u32", rows[r], offset), 1))
                left = k.op("sub.s32", k.op("sub.u32", limit, key0), pair)
                for n in range(BN // 8):
                    for e in range(2):
                        seen = k.setp("gt.s32", left, 8 * n + e)
                        k.to(s[n][2 * r + e], "selp.f32", s[n][2 * r + e], NEG_INF, seen)
        corrections = []
        for r in range(2):
            row = [s[n][2 * r + e] for n in range(BN // 8) for e in range(2)]
            top = _quad_reduce(k, k.tree("max.f32", [m[r], *row]), "max.f32")
            minus_top = k.op("neg.f32", k.op("mul.f32", top, scale_log2))
            # 2^((m_old - m_new) * scale log2 e): 0 for the first tile's m_old = -inf
            corrections.append(k.op("ex2.approx.ftz.f32",
                                    k.op("fma.rn.f32", m[r], scale_log2, minus_top)))
            k.to(m[r], "mov.f32", top)
            for x in row:
                k.to(x, "ex2.approx.ftz.f32", k.op("fma.rn.f32", x, scale_log2, minus_top))
            k.to(l[r], "fma.rn.f32", l[r], corrections[r], k.tree("add.f32", row))
        for tile_o in o:
            for e in range(4):
                k.to(tile_o[e], "mul.f32", tile_o[e], corrections[e // 2])
        # P as the A fragments of P V, keys 16 kk ..: (row g, keys 2t..), (g + 8, 2t..),
        # (g, 2t + 8..), (g + 8, 2t + 8..); the lower half of a pair is the first key
        p_frags = []
        for kk in range(BN // 16):
            regs = []
            for n, r in ((2 * kk, 0), (2 * kk, 1), (2 * kk + 1, 0), (2 * kk + 1, 1)):
                packed = k.reg("b32")
                k.emit(f"cvt.rn.f16x2.f32 {packed}, {s[n][2 * r + 1]}, {s[n][2 * r]}")
                regs.append(packed)
            p_frags.append(regs)

        k.emit("cp.async.wait_group 0")  # V of this tile
        k.emit("bar.sync 0")             # .. for all; and every warp is done with K's buffer
        with k.if_(k.setp("lt.u32", k.op("add.u32", j, 1), n_tiles)):
            kv_copy.copy(keys, k.op("add.u32", key0, BN), skv, k_buffer)
            k.emit("cp.async.commit_group")
        v_columns = columns(v_rows, v_x16)
        for kk, a in enumerate(p_frags):
            for dp, column in enumerate(v_columns):
                b = _ldmatrix(k, f"{column}+{kk * 16 * row_bytes}", trans=True)
                for half in range(2):
                    acc = o[2 * dp + half]
                    _mma(k, acc, a, b[2 * half:2 * half + 2], acc)

    rows, pair = accumulator_rows()
    for r in range(2):
        total = _quad_reduce(k, l[r], "add.f32")
        inverse = k.op("rcp.rn.f32", total)
        ok = k.setp("lt.u32", rows[r], sq)
        index = k.op("mad.lo.u32", k.op("mad.lo.u32", rows[r], hq, head), D, pair)
        address = k.element(out, index, 2 if half_out else 4)
        for n, tile_o in enumerate(o):
            x, y = (k.op("mul.f32", tile_o[2 * r + e], inverse) for e in range(2))
            if half_out:  # the pair as one float16x2 word (x in the low half)
                word = k.reg("b32")
                k.emit(f"cvt.rn.f16x2.f32 {word}, {y}, {x}")
                k.emit(f"@{ok} st.global.b32 [{address}+{n * 16}], {word}")
            else:
                k.emit(f"@{ok} st.global.v2.f32 [{address}+{n * 32}], {{{x}, {y}}}")
    return k


def attention_f32(dims_per_lane: int = 4) -> Kernel:
    """Grid ceil(Sq * Hq / WARPS), THREADS threads: warp w of block b takes (query, head)
    task b * WARPS + w = query * Hq + head; head dimension d <= 32 * dims_per_lane."""
    k = Kernel(f"attention_f32_r{dims_per_lane}",
               [("q", "u64"), ("k", "u64"), ("v", "u64"), ("out", "u64"), ("sq", "u32"),
                ("skv", "u32"), ("hq", "u32"), ("hkv", "u32"), ("d", "u32"), ("offset", "u32"),
                ("scale_log2", "f32")])
    q, keys, values, out, sq, skv, hq, hkv, d, offset, scale_log2 = k.params()
    q_rows = k.shared("q_rows", "f32", WARPS * MAX_HEAD_DIM, 16)
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    task = k.op("mad.lo.u32", k.special("%ctaid.x"), WARPS, warp)
    # a whole warp takes a task or none: the warps of a block never wait for each other
    with k.if_(k.setp("lt.u32", task, k.op("mul.lo.u32", sq, hq))):
        query = k.op("div.u32", task, hq)
        kv_head = k.op("div.u32", k.op("rem.u32", task, hq), k.op("div.u32", hq, hkv))
        mine = [k.setp("lt.u32", k.op("add.u32", lane, 32 * r), d) for r in range(dims_per_lane)]
        row = k.op("mad.lo.u32", warp, MAX_HEAD_DIM * 4, k.op("mov.u32", q_rows))
        q_lane = k.element(q, k.op("mad.lo.u32", task, d, lane), 4)
        row_lane = k.op("mad.lo.u32", lane, 4, row)
        for r in range(dims_per_lane):
            x = k.op("mov.f32", f32(0.0))
            k.emit(f"@{mine[r]} ld.global.f32 {x}, [{q_lane}+{128 * r}]")
            scaled = k.op("mul.f32", x, scale_log2)  # scores in units of log2
            k.emit(f"@{mine[r]} st.shared.f32 [{row_lane}+{128 * r}], {scaled}")
        k.emit("bar.warp.sync 0xffffffff")  # the row, written by all lanes, read by each
        n_keys = k.op("min.u32", skv, k.op("add.u32", k.op("add.u32", query, offset), 1))
        kv_row = k.op("mul.lo.u32", hkv, d)  # values between keys
        kv_lane = k.op("mad.lo.u32", kv_head, d, lane)
        top = k.op("mov.f32", NEG_INF)
        total = k.op("mov.f32", f32(0.0))  # this lane's part of the sum
        acc = [k.op("mov.f32", f32(0.0)) for _ in range(dims_per_lane)]
        start = k.op("mov.u32", 0)
        with k.loop(start, n_keys, 32):
            key = k.op("add.u32", start, lane)
            seen = k.setp("lt.u32", key, n_keys)
            safe_key = k.op("min.u32", key, k.op("sub.u32", n_keys, 1))
            key_row = k.element(keys, k.op("mad.lo.u32", safe_key, kv_row,
                                           k.op("mul.lo.u32", kv_head, d)), 4)
            dot = k.op("mov.f32", f32(0.0))
            e = k.op("mov.u32", 0)
            with k.loop(e, d, 1):
                qe = k.load("f32", k.op("mad.lo.u32", e, 4, row), space="shared")
                ke = k.load("f32", k.element(key_row, e, 4))
                k.to(dot, "fma.rn.f32", qe, ke, dot)
            score = k.op("selp.f32", dot, NEG_INF, seen)
            chunk_top = score
            for width in (16, 8, 4, 2, 1):
                chunk_top = k.op("max.f32", chunk_top, k.op("shfl.sync.bfly.b32", chunk_top,
                                                             width, "0x1f", "0xffffffff"))
            new_top = k.op("max.f32", top, chunk_top)
            correction = k.op("ex2.approx.ftz.f32", k.op("sub.f32", top, new_top))
            p = k.op("ex2.approx.ftz.f32", k.op("sub.f32", score, new_top))
            k.to(top, "mov.f32", new_top)
            k.to(total, "fma.rn.f32", total, correction, p)
            for x in acc:
                k.to(x, "mul.f32", x, correction)
            count = k.op("min.u32", k.op("sub.u32", n_keys, start), 32)
            jj = k.op("mov.u32", 0)
            with k.loop(jj, count, 1):
                pj = k.op("shfl.sync.idx.b32", p, jj, "0x1f", "0xffffffff")
                value_row = k.element(values, k.op("mad.lo.u32", k.op("add.u32", start, jj),
                                                   kv_row, kv_lane), 4)
                for r in range(dims_per_lane):
                    x = k.op("mov.f32", f32(0.0))
                    k.emit(f"@{mine[r]} ld.global.f32 {x}, [{value_row}+{128 * r}]")
                    k.to(acc[r], "fma.rn.f32", pj, x, acc[r])
        for width in (16, 8, 4, 2, 1):
            total = k.op("add.f32", total, k.op("shfl.sync.bfly.b32", total, width, "0x1f",
                                                "0xffffffff"))
        inverse = k.op("rcp.rn.f32", total)
        out_lane = k.element(out, k.op("mad.lo.u32", task, d, lane), 4)
        for r in range(dims_per_lane):
            k.emit(f"@{mine[r]} st.global.f32 [{out_lane}+{128 * r}], "
                   f"{k.op('mul.f32', acc[r], inverse)}")
    return k


def variants():
    for shape in SHAPES:
        yield flash_f16, shape
    for shape in DEFAULT.values():
        yield flash_f16, (*shape, True, True)
    for dims_per_lane in range(1, MAX_HEAD_DIM // 32 + 1):
        yield attention_f32, (dims_per_lane,)
