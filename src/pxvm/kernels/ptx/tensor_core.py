"""Tensor-core matrix product in PTX: C (M, N) float32 = A (M, K) @ B^T for A and B (N, K)
float16, with float32 accumulation (mma.sync m16n8k16, sm_80 and later).

A block of 256 threads (8 warps, 2 x 4) computes a TILE x TILE tile of C, each warp a
64 x 32 piece of it: 4 x 4 mma tiles of 16 x 8, their accumulators in registers. K
advances DEPTH values a step through shared memory, two stages: cp.async copies the
next step's slices (16 bytes a thread a copy, zeros past the matrices' edges) while the
warps multiply the current one, ldmatrix hands each warp its fragments. Rows of a slice
are 64 bytes (4 chunks of 16); chunk c of row r is stored at c ^ ((r >> 1) & 3), so that
the 8 rows one ldmatrix reads fall in 8 different bank groups.

K must be a multiple of 8 (whole 16-byte chunks); M and N are any size.
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32

THREADS = 256
TILE = 128
DEPTH = 32                  # K values per step (two mma k16 steps)
ROW_BYTES = DEPTH * 2       # a slice row: DEPTH float16 values
SLICE_BYTES = TILE * ROW_BYTES
STAGE_BYTES = 2 * SLICE_BYTES  # A's slice, then B's
WARP_M, WARP_N = 64, 32     # a warp's piece of the tile
M_TILES, N_TILES = WARP_M // 16, WARP_N // 8


def _swizzled(k: Kernel, row: Reg, chunk) -> Reg:
    """Byte offset of 16-byte chunk `chunk` of slice row `row`."""
    mixed = k.op("xor.b32", chunk, k.op("and.b32", k.op("shr.u32", row, 1), 3))
    return k.op("mad.lo.u32", row, ROW_BYTES, k.op("shl.b32", mixed, 4))


def _copy_slices(k: Kernel, a: Reg, b: Reg, M: Reg, N: Reg, K: Reg, row0: Reg, col0: Reg,
                 k0: Reg, tid: Reg, stage: Reg) -> None:
    """cp.async this thread's four chunks of the A and B slices at K offset k0 into
    `stage` (a shared address); chunks past an edge are filled with zeros."""
    for operand, (src, rows, first) in enumerate(((a, M, row0), (b, N, col0))):
        for half in range(2):
            chunk = k.op("add.u32", tid, half * THREADS)      # 0 .. 511
            r = k.op("shr.u32", chunk, 2)
            c = k.op("and.b32", chunk, 3)
            row = k.op("add.u32", first, r)
            kk = k.op("mad.lo.u32", c, 8, k0)
            ok = k.op("and.pred", k.setp("lt.u32", row, rows), k.setp("lt.u32", kk, K))
            size = k.op("selp.u32", 16, 0, ok)
            # an address inside the matrix even when nothing is read (size 0)
            safe_row = k.op("selp.u32", row, 0, ok)
            safe_k = k.op("selp.u32", kk, 0, ok)
            src_addr = k.element(src, k.op("mad.lo.u32", safe_row, K, safe_k), 2)
            dst = k.op("add.u32", k.op("add.u32", stage, operand * SLICE_BYTES),
                       _swizzled(k, r, c))
            k.emit(f"cp.async.cg.shared.global [{dst}], [{src_addr}], 16, {size}")
    k.emit("cp.async.commit_group")


def matmul_f16_bt() -> Kernel:
    k = Kernel("matmul_f16_bt", [("a", "u64"), ("b", "u64"), ("c", "u64"), ("M", "u32"),
                                 ("N", "u32"), ("K", "u32")])
    a, b, c, M, N, K = k.params()
    stages = k.op("mov.u32", k.shared("stages", "b8", 2 * STAGE_BYTES, 128))
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    warp_row = k.op("mul.lo.u32", k.op("shr.u32", warp, 2), WARP_M)   # 0 or 64
    warp_col = k.op("mul.lo.u32", k.op("and.b32", warp, 3), WARP_N)   # 0, 32, 64, 96
    row0 = k.op("mul.lo.u32", k.special("%ctaid.y"), TILE)
    col0 = k.op("mul.lo.u32", k.special("%ctaid.x"), TILE)
    acc = [[[k.op("mov.f32", f32(0.0)) for _ in range(4)] for _ in range(N_TILES)]
           for _ in range(M_TILES)]
    # ldmatrix rows this lane addresses: lane l gives row l % 8 of matrix l / 8
    matrix = k.op("shr.u32", lane, 3)
    in_matrix = k.op("and.b32", lane, 7)
    a_rows = [k.op("add.u32", k.op("add.u32", warp_row, i * 16),
                   k.op("mad.lo.u32", k.op("and.b32", matrix, 1), 8, in_matrix))
              for i in range(M_TILES)]
    a_chunk = k.op("shr.u32", matrix, 1)
    b_rows = [k.op("add.u32", k.op("add.u32", warp_col, p * 16),
                   k.op("mad.lo.u32", k.op("shr.u32", matrix, 1), 8, in_matrix))
              for p in range(N_TILES // 2)]
    b_chunk = k.op("and.b32", matrix, 1)
    k0 = k.op("mov.u32", 0)
    step = k.op("mov.u32", 0)
    _copy_slices(k, a, b, M, N, K, row0, col0, k0, tid, stages)
    with k.loop(k0, K, DEPTH):
        current = k.op("mad.lo.u32", k.op("and.b32", step, 1), STAGE_BYTES, stages)
        following = k.op("mad.lo.u32", k.op("xor.b32", k.op("and.b32", step, 1), 1),
                         STAGE_BYTES, stages)
        _copy_slices(k, a, b, M, N, K, row0, col0, k.op("add.u32", k0, DEPTH), tid, following)
        k.emit("cp.async.wait_group 1")
        k.emit("bar.sync 0")
        b_base = k.op("add.u32", current, SLICE_BYTES)
        for s in range(DEPTH // 16):
            a_frags = []
            for i in range(M_TILES):
                regs = [k.reg("b32") for _ in range(4)]
                address = k.op("add.u32", current,
                               _swizzled(k, a_rows[i], k.op("add.u32", a_chunk, 2 * s)))
                k.emit(f"ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                       f"{{{', '.join(map(str, regs))}}}, [{address}]")
                a_frags.append(regs)
            b_frags = []
            for p in range(N_TILES // 2):
                regs = [k.reg("b32") for _ in range(4)]
                address = k.op("add.u32", b_base,
                               _swizzled(k, b_rows[p], k.op("add.u32", b_chunk, 2 * s)))
                k.emit(f"ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                       f"{{{', '.join(map(str, regs))}}}, [{address}]")
                b_frags += [regs[:2], regs[2:]]
            for i in range(M_TILES):
                for j in range(N_TILES):
                    d = ", ".join(map(str, acc[i][j]))
                    k.emit(f"mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {{{d}}}, "
                           f"{{{', '.join(map(str, a_frags[i]))}}}, "
                           f"{{{', '.join(map(str, b_frags[j]))}}}, {{{d}}}")
        k.emit("bar.sync 0")
        k.to(step, "add.u32", step, 1)
    k.emit("cp.async.wait_group 0")
    group = k.op("shr.u32", lane, 2)
    pair = k.op("shl.b32", k.op("and.b32", lane, 3), 1)
    for i in range(M_TILES):
        for half in range(2):
            row = k.op("add.u32", k.op("add.u32", row0, warp_row),
                       k.op("add.u32", group, i * 16 + half * 8))
            row_ok = k.setp("lt.u32", row, M)
            for j in range(N_TILES):
                for e in range(2):
                    col = k.op("add.u32", k.op("add.u32", col0, warp_col),
                               k.op("add.u32", pair, j * 8 + e))
                    ok = k.op("and.pred", row_ok, k.setp("lt.u32", col, N))
                    address = k.element(c, k.op("mad.lo.u32", row, N, col), 4)
                    k.emit(f"@{ok} st.global.f32 [{address}], {acc[i][j][half * 2 + e]}")
    return k


def variants():
    yield matmul_f16_bt, ()
