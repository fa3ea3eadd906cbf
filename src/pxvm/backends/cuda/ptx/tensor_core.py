"""Tensor-core matrix product in PTX: C (M, N) float32 = A (M, K) @ B^T for A and B (N, K)
float16, with float32 accumulation (mma.sync m16n8k16, sm_80 and later).

A block computes a TILE x BLOCK_N tile of C, each warp a 64 x WARP_N piece of it: 4 x
WARP_N/8 mma tiles of 16 x 8, their accumulators in registers. K advances DEPTH values a
step through shared memory, STAGES deep: cp.async copies later steps' slices (16 bytes a
thread a copy, zeros past the matrices' edges) while the warps multiply the current one,
ldmatrix hands each warp its fragments. Rows of a slice
are 64 bytes (4 chunks of 16); chunk c of row r is stored at c ^ ((r >> 1) & 3), so that
the 8 rows one ldmatrix reads fall in 8 different bank groups.

K must be a multiple of 8 (whole 16-byte chunks); M and N are any size.
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32

TILE = 128                  # C rows of a block (BLOCK_N columns: a kernel parameter)
DEPTH = 32                  # K values per step (two mma k16 steps)
ROW_BYTES = DEPTH * 2       # a slice row: DEPTH float16 values
WARP_M = 64                 # a warp's rows (WARP_N columns: a kernel parameter)
M_TILES = WARP_M // 16
#: (block columns, warp columns, pipeline stages) of the kernel the op launches: the
#: fastest of SHAPES on the H100 (docs/benchmarks-log.md)
DEFAULT = (128, 64, 2)


def threads(block_n: int, warp_n: int) -> int:
    """Threads of a block: warps of 64 x warp_n, 2 down and block_n / warp_n across."""
    return 32 * (TILE // WARP_M) * (block_n // warp_n)


def _swizzled(k: Kernel, row: Reg, chunk) -> Reg:
    """Byte offset of 16-byte chunk `chunk` of slice row `row`."""
    mixed = k.op("xor.b32", chunk, k.op("and.b32", k.op("shr.u32", row, 1), 3))
    return k.op("mad.lo.u32", row, ROW_BYTES, k.op("shl.b32", mixed, 4))


def _copy_slices(k: Kernel, a: Reg, b: Reg, M: Reg, N: Reg, K: Reg, row0: Reg, col0: Reg,
                 k0: Reg, tid: Reg, stage: Reg, block_n: int, n_threads: int) -> None:
    """cp.async this thread's chunks of the A and B slices at K offset k0 into `stage`
    (a shared address: A's TILE rows, then B's block_n); chunks past an edge are zeros."""
    for base, src, rows, first, slice_rows in ((0, a, M, row0, TILE),
                                               (TILE * ROW_BYTES, b, N, col0, block_n)):
        for part in range(slice_rows * 4 // n_threads):
            chunk = k.op("add.u32", tid, part * n_threads)
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
            dst = k.op("add.u32", k.op("add.u32", stage, base), _swizzled(k, r, c))
            k.emit(f"cp.async.cg.shared.global [{dst}], [{src_addr}], 16, {size}")
    k.emit("cp.async.commit_group")


def matmul_f16_bt(block_n: int = 128, warp_n: int = 32, stages: int = 2) -> Kernel:
    n_threads = threads(block_n, warp_n)
    n_tiles = warp_n // 8
    stage_bytes = (TILE + block_n) * ROW_BYTES
    k = Kernel(f"matmul_f16_bt_{block_n}x{warp_n}x{stages}",
               [("a", "u64"), ("b", "u64"), ("c", "u64"), ("M", "u32"), ("N", "u32"),
                ("K", "u32")])
    a, b, c, M, N, K = k.params()
    buffers = k.op("mov.u32", k.shared("stages", "b8", stages * stage_bytes, 128))
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    across = block_n // warp_n
    warp_row = k.op("mul.lo.u32", k.op("div.u32", warp, across), WARP_M)
    warp_col = k.op("mul.lo.u32", k.op("rem.u32", warp, across), warp_n)
    row0 = k.op("mul.lo.u32", k.special("%ctaid.y"), TILE)
    col0 = k.op("mul.lo.u32", k.special("%ctaid.x"), block_n)
    acc = [[[k.op("mov.f32", f32(0.0)) for _ in range(4)] for _ in range(n_tiles)]
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
              for p in range(n_tiles // 2)]
    b_chunk = k.op("and.b32", matrix, 1)

    def stage_address(step: Reg) -> Reg:
        return k.op("mad.lo.u32", k.op("rem.u32", step, stages), stage_bytes, buffers)

    # the first stages - 1 steps' slices are on their way before the loop
    for ahead in range(stages - 1):
        start = k.op("mov.u32", ahead * DEPTH)
        _copy_slices(k, a, b, M, N, K, row0, col0, start, tid,
                     k.op("add.u32", buffers, ahead * stage_bytes), block_n, n_threads)
    k0 = k.op("mov.u32", 0)
    step = k.op("mov.u32", 0)
    with k.loop(k0, K, DEPTH):
        current = stage_address(step)
        _copy_slices(k, a, b, M, N, K, row0, col0,
                     k.op("add.u32", k0, (stages - 1) * DEPTH), tid,
                     stage_address(k.op("add.u32", step, stages - 1)), block_n, n_threads)
        k.emit(f"cp.async.wait_group {stages - 1}")
        k.emit("bar.sync 0")
        b_base = k.op("add.u32", current, TILE * ROW_BYTES)
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
            for p in range(n_tiles // 2):
                regs = [k.reg("b32") for _ in range(4)]
                address = k.op("add.u32", b_base,
                               _swizzled(k, b_rows[p], k.op("add.u32", b_chunk, 2 * s)))
                k.emit(f"ldmatrix.sync.aligned.m8n8.x4.shared.b16 "
                       f"{{{', '.join(map(str, regs))}}}, [{address}]")
                b_frags += [regs[:2], regs[2:]]
            for i in range(M_TILES):
                for j in range(n_tiles):
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
            for j in range(n_tiles):
                for e in range(2):
                    col = k.op("add.u32", k.op("add.u32", col0, warp_col),
                               k.op("add.u32", pair, j * 8 + e))
                    ok = k.op("and.pred", row_ok, k.setp("lt.u32", col, N))
                    address = k.element(c, k.op("mad.lo.u32", row, N, col), 4)
                    k.emit(f"@{ok} st.global.f32 [{address}], {acc[i][j][half * 2 + e]}")
    return k


#: the shapes tried on the H100 (docs/benchmarks-log.md); DEFAULT is the one the op launches
SHAPES = ((128, 32, 2), (128, 32, 3), (128, 64, 2), (128, 64, 3), (256, 64, 2))


def variants():
    for shape in SHAPES:
        yield matmul_f16_bt, shape
