"""Tensor-core matrix product on Hopper (sm_90a) in PTX: C (M, N) float32 = A (M, K) @ B^T
for A and B (N, K) float16, float32 accumulation, with `wgmma`: a warpgroup (4 warps)
multiplies a 64 x BLOCK_N piece straight from shared memory, without the register traffic
of Ampere's mma.sync (tensor_core.py).

A block of WARPGROUPS warpgroups computes a (64 * WARPGROUPS) x block_n tile of C. K
advances DEPTH (64) values a step through `stages` shared slices: cp.async copies later
steps' slices (16 bytes a copy, zeros past the matrices' edges) while the tensor cores
multiply the current one. A slice row is 128 bytes (64 float16), laid out in the 128-byte
swizzle wgmma reads: chunk c of row r is stored at chunk c ^ (r % 8), rows 128 bytes
apart, so 8 rows make a 1024-byte atom (slices are 1024-byte aligned). `in_flight`:
wgmma groups left running while the next step's copies are issued.

K must be a multiple of 8 (whole 16-byte chunks); M and N are any size.

`split`: a grid of few blocks (a batch's few rows times a weight of few rows: 16 blocks
for 4096 columns on 132 multiprocessors) leaves most of the GPU idle, so the grid's
depth cuts K into ranges of whole steps, block (x, y, z) multiplying range z into slice z
of a workspace (splits, M, N); `split_sum` adds the slices up (and the residual) in a
launch of its own, in a fixed order (the same sums every run, unlike atomic adds).
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32
from .elementwise import _unary_math

ARCH = "sm_90a"            # wgmma is a Hopper feature of the sm_90a target
WARPGROUPS = 2
ROWS = 64 * WARPGROUPS     # C rows of a block
DEPTH = 64                 # K values a step
ROW_BYTES = DEPTH * 2      # a slice row: 128 bytes, one swizzle row
THREADS = 128 * WARPGROUPS
#: (block columns, stages, wgmma groups in flight) of the kernel the op launches
DEFAULT = (256, 4, 1)
#: the activations of the GLU epilogue (matmul_f16_wgmma's `glu`)
GLU_ACTIVATIONS = ("silu", "gelu_tanh")
#: the shapes the benchmarks try (docs/benchmarks-log.md)
SHAPES = ((128, 4, 0), (128, 6, 0), (128, 6, 1), (256, 3, 0), (256, 4, 1))


def shared_bytes(block_n: int, stages: int) -> int:
    """Dynamic shared memory of a block (slices of A then B per stage, plus the
    1024-byte alignment the swizzle needs)."""
    return stages * (ROWS + block_n) * ROW_BYTES + 1024


def swizzle_base(k: Kernel) -> Reg:
    """The first 1024-byte boundary of the kernel's dynamic shared memory (named
    "slices"): the 128-byte swizzle repeats every 1024 bytes, so slices start on one."""
    dynamic = k.op("mov.u32", k.shared("slices", "b8", None, 1024))
    return k.op("and.b32", k.op("add.u32", dynamic, 1023), ~1023 & 0xFFFFFFFF)


def _descriptor(k: Kernel, address: Reg) -> Reg:
    """wgmma's shared-memory matrix descriptor of a K-major slice at `address`: start
    address / 16 (bits 0-13), leading byte offset 16 / 16 (bits 16-29; unused by the
    swizzled layout), stride byte offset 1024 / 16 between 8-row atoms (bits 32-45),
    128-byte swizzle (mode 1 at bits 62-63)."""
    low = k.op("or.b32", k.op("and.b32", k.op("shr.u32", address, 4), 0x3FFF), 1 << 16)
    high = k.op("mov.b32", (1024 >> 4) | (1 << 30))
    return k.op("mov.b64", f"{{{low}, {high}}}")


def _copy_slices(k: Kernel, a: Reg, b: Reg, M: Reg, N: Reg, K: Reg, row0: Reg, col0: Reg,
                 k0: Reg, tid: Reg, stage: Reg, block_n: int, k_end: Reg) -> None:
    """cp.async this thread's chunks of the A and B slices at K offset k0 into `stage`
    (A's ROWS rows, then B's block_n), then commit them as one group; zeros from k_end
    (K, or the end of the block's range of K)."""
    for base, src, rows, first, slice_rows in ((0, a, M, row0, ROWS),
                                               (ROWS * ROW_BYTES, b, N, col0, block_n)):
        for part in range(slice_rows * 8 // THREADS):
            chunk = k.op("add.u32", tid, part * THREADS)
            r = k.op("shr.u32", chunk, 3)
            c = k.op("and.b32", chunk, 7)
            row = k.op("add.u32", first, r)
            kk = k.op("mad.lo.u32", c, 8, k0)
            ok = k.op("and.pred", k.setp("lt.u32", row, rows), k.setp("lt.u32", kk, k_end))
            size = k.op("selp.u32", 16, 0, ok)
            # an address inside the matrix even when nothing is read (size 0)
            src_addr = k.element(src, k.op("mad.lo.u32", k.op("selp.u32", row, 0, ok), K,
                                           k.op("selp.u32", kk, 0, ok)), 2)
            swizzled = k.op("xor.b32", c, k.op("and.b32", r, 7))
            dst = k.op("add.u32", k.op("add.u32", stage, base),
                       k.op("mad.lo.u32", r, ROW_BYTES, k.op("shl.b32", swizzled, 4)))
            k.emit(f"cp.async.cg.shared.global [{dst}], [{src_addr}], 16, {size}")
    k.emit("cp.async.commit_group")


def matmul_f16_wgmma(block_n: int = 128, stages: int = 4, in_flight: int = 0,
                     residual: bool = False, glu: str | None = None,
                     split: bool = False) -> Kernel:
    """The kernel of one shape; with `residual`, C = A @ B^T + R for R (M, N) float32 (a
    transformer's residual add, in the same pass). With `glu` (silu, gelu_tanh), B's rows
    come in pairs of block_n / 2 gate rows then their block_n / 2 up rows (glu_rows), and
    C (M, N / 2) = glu(A @ gate^T) * (A @ up^T): a block's gate and up columns meet in
    the same threads' accumulators. With `split`, C is the workspace (%nctaid.z, M, N) and
    block z multiplies the z-th range of K's steps (module docstring)."""
    ahead = stages - 1 - in_flight  # steps whose slices are on their way
    if ahead < 1 or block_n % 64 or not 64 <= block_n <= 256:
        raise ValueError(f"no wgmma kernel of {block_n} columns, {stages} stages, "
                         f"{in_flight} in flight")
    if split and (residual or glu):
        raise ValueError("a split product's slices are summed by split_sum, which adds "
                         "the residual; a GLU's epilogue needs whole sums")
    stage_bytes = (ROWS + block_n) * ROW_BYTES
    k = Kernel(f"matmul_f16_wgmma_{block_n}x{stages}x{in_flight}{'_add' if residual else ''}"
               f"{f'_{glu}' if glu else ''}{'_split' if split else ''}",
               [("a", "u64"), ("b", "u64"), ("c", "u64"), ("M", "u32"), ("N", "u32"),
                ("K", "u32"), *([("r", "u64")] if residual else [])], arch=ARCH)
    a, b, c, M, N, K, *r = k.params()
    buffers = swizzle_base(k)
    tid = k.special("%tid.x")
    group = k.op("shr.u32", tid, 7)  # this thread's warpgroup
    row0 = k.op("mul.lo.u32", k.special("%ctaid.y"), ROWS)
    col0 = k.op("mul.lo.u32", k.special("%ctaid.x"), block_n)
    acc = [k.op("mov.f32", f32(0.0)) for _ in range(block_n // 2)]
    accumulate = k.setp("eq.u32", 0, 0)
    steps = k.op("shr.u32", k.op("add.u32", K, DEPTH - 1), 6)
    first_step, k_end = k.op("mov.u32", 0), K
    if split:  # this block's steps: range z of %nctaid.z, its slice of the workspace
        z = k.special("%ctaid.z")
        per = k.op("div.u32", k.op("add.u32", steps, k.op("sub.u32", k.special("%nctaid.z"), 1)),
                   k.special("%nctaid.z"))
        first_step = k.op("mul.lo.u32", z, per)
        steps = k.op("min.u32", steps, k.op("add.u32", first_step, per))
        k_end = k.op("min.u32", K, k.op("shl.b32", steps, 6))
        c = k.element(c, k.op("mul.lo.u32", z, k.op("mul.lo.u32", M, N)), 4)

    def stage_address(step: Reg) -> Reg:
        return k.op("mad.lo.u32", k.op("rem.u32", step, stages), stage_bytes, buffers)

    for s in range(ahead):
        at = k.op("add.u32", first_step, s)
        _copy_slices(k, a, b, M, N, K, row0, col0, k.op("shl.b32", at, 6), tid,
                     stage_address(at), block_n, k_end)
    step = k.op("mov.u32", first_step)
    with k.loop(step, steps, 1):
        k.emit(f"cp.async.wait_group {ahead - 1}")
        # the copies were made through the generic proxy, wgmma reads through the async one
        k.emit("fence.proxy.async.shared::cta")
        k.emit("bar.sync 0")  # every copy of this step landed; every earlier wgmma done
        later = k.op("add.u32", step, ahead)  # past the last step: zero-size copies
        _copy_slices(k, a, b, M, N, K, row0, col0, k.op("shl.b32", later, 6), tid,
                     stage_address(later), block_n, k_end)
        current = stage_address(step)
        a_slice = k.op("mad.lo.u32", group, 64 * ROW_BYTES, current)
        b_slice = k.op("add.u32", current, ROWS * ROW_BYTES)
        k.emit("wgmma.fence.sync.aligned")
        for s in range(DEPTH // 16):  # k16 products along the slice: 32 bytes further
            da = _descriptor(k, k.op("add.u32", a_slice, 32 * s))
            db = _descriptor(k, k.op("add.u32", b_slice, 32 * s))
            k.emit(f"wgmma.mma_async.sync.aligned.m64n{block_n}k16.f32.f16.f16 "
                   f"{{{', '.join(map(str, acc))}}}, {da}, {db}, {accumulate}, 1, 1, 0, 0")
        k.emit("wgmma.commit_group.sync.aligned")
        k.emit(f"wgmma.wait_group.sync.aligned {in_flight}")
    k.emit("wgmma.wait_group.sync.aligned 0")
    k.emit("cp.async.wait_group 0")
    # accumulator layout: warp w of the warpgroup holds rows 16w .. 16w + 15; for each 8
    # columns j, a lane's registers 4j, 4j + 1 are row l / 4, columns 8j + 2 (l % 4) + 0, 1
    # and registers 4j + 2, 4j + 3 the same columns 8 rows down
    warp = k.op("and.b32", k.op("shr.u32", tid, 5), 3)
    lane = k.op("and.b32", tid, 31)
    top = k.op("add.u32", k.op("add.u32", row0, k.op("shl.b32", group, 6)),
               k.op("mad.lo.u32", warp, 16, k.op("shr.u32", lane, 2)))
    pair = k.op("add.u32", col0, k.op("shl.b32", k.op("and.b32", lane, 3), 1))
    if glu is not None:
        _glu_epilogue(k, c, acc, M, N, top, k.op("shl.b32", k.op("and.b32", lane, 3), 1),
                      k.op("mul.lo.u32", k.special("%ctaid.x"), block_n // 2), block_n, glu)
        return k
    even_n = k.setp("eq.u32", k.op("and.b32", N, 1), 0)
    for half in range(2):
        row = k.op("add.u32", top, 8 * half)
        with k.if_(k.setp("lt.u32", row, M)):
            line = k.op("mul.lo.u32", row, N)
            for j in range(block_n // 8):
                col = k.op("add.u32", pair, 8 * j)
                values = acc[4 * j + 2 * half: 4 * j + 2 * half + 2]
                index = k.op("add.u32", line, col)
                address = k.element(c, index, 4)
                both = k.op("and.pred", even_n, k.setp("lt.u32", col, N))
                first = k.setp("lt.u32", col, N)
                second = k.setp("lt.u32", k.op("add.u32", col, 1), N)
                if residual:
                    values = _plus_residual(k, r[0], index, values, both, first, second)
                k.emit(f"@{both} st.global.v2.f32 [{address}], "
                       f"{{{values[0]}, {values[1]}}}")
                # odd N: the pair is not 8-byte aligned, each value alone
                with k.if_(k.op("not.pred", both)):
                    k.emit(f"@{first} st.global.f32 [{address}], {values[0]}")
                    k.emit(f"@{second} st.global.f32 [{address}+4], {values[1]}")
    return k


def glu_rows(n: int, block_n: int) -> list[tuple[int, int]]:
    """(source row, count) runs of a GLU weight [gate (F rows); up (F rows)] in the order
    the GLU kernel reads: block_n / 2 gate rows, then the same rows of up, and so on."""
    f, half = n // 2, block_n // 2
    return [(start + part, half) for start in range(0, f, half) for part in (0, f)]


def _glu_epilogue(k: Kernel, c: Reg, acc: list[Reg], M: Reg, N: Reg, top: Reg, pair: Reg,
                  first_column: Reg, block_n: int, act: str) -> None:
    """C's columns first_column + 8 j + pair (+1) of rows top, top + 8: act(gate) * up,
    gate in the accumulators' first block_n / 16 n8 tiles, up in the rest."""
    f = k.op("shr.u32", N, 1)
    tiles = block_n // 16
    for half in range(2):
        row = k.op("add.u32", top, 8 * half)
        with k.if_(k.setp("lt.u32", row, M)):
            line = k.op("mul.lo.u32", row, f)
            for j in range(tiles):
                col = k.op("add.u32", first_column, k.op("add.u32", pair, 8 * j))
                gate = acc[4 * j + 2 * half: 4 * j + 2 * half + 2]
                up = acc[4 * (j + tiles) + 2 * half: 4 * (j + tiles) + 2 * half + 2]
                values = [k.op("mul.f32", _unary_math(k, act, g, g, g), u)
                          for g, u in zip(gate, up)]
                address = k.element(c, k.op("add.u32", line, col), 4)
                k.emit(f"@{k.setp('lt.u32', col, f)} st.global.v2.f32 [{address}], "
                       f"{{{values[0]}, {values[1]}}}")


def _plus_residual(k: Kernel, r: Reg, index: Reg, values: list[Reg], both: Reg, first: Reg,
                   second: Reg) -> list[Reg]:
    """values + R[index], R[index + 1], read as a pair where `both`, else one by one."""
    address = k.element(r, index, 4)
    added = [k.reg("f32"), k.reg("f32")]
    k.emit(f"@{both} ld.global.v2.f32 {{{added[0]}, {added[1]}}}, [{address}]")
    with k.if_(k.op("not.pred", both)):
        k.emit(f"@{first} ld.global.f32 {added[0]}, [{address}]")
        k.emit(f"@{second} ld.global.f32 {added[1]}, [{address}+4]")
    return [k.op("add.f32", v, x) for v, x in zip(values, added)]


def split_sum(residual: bool = False) -> Kernel:
    """c[i] = sum over z of workspace[z][i] (z = 0 .. splits - 1, in order) [+ r[i]], i <
    count: a split product's slices added up."""
    k = Kernel(f"split_sum{'_add' if residual else ''}",
               [("workspace", "u64"), ("c", "u64"), ("count", "u32"), ("splits", "u32"),
                *([("r", "u64")] if residual else [])])
    workspace, c, count, splits, *r = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, count, stride):
        total = k.load("f32", k.element(r[0], i, 4)) if residual else k.op("mov.f32", f32(0.0))
        z = k.op("mov.u32", 0)
        at = k.op("mov.u32", i)
        with k.loop(z, splits, 1):
            k.to(total, "add.f32", total, k.load("f32", k.element(workspace, at, 4)))
            k.to(at, "add.u32", at, count)
        k.store("f32", k.element(c, i, 4), total)
    return k


def variants():
    for shape in SHAPES:
        yield matmul_f16_wgmma, shape
    yield matmul_f16_wgmma, (*DEFAULT, True)
    yield matmul_f16_wgmma, (*DEFAULT, False, None, True)
    for residual in (False, True):
        yield split_sum, (residual,)
    for act in GLU_ACTIVATIONS:
        yield matmul_f16_wgmma, (*DEFAULT, False, act)
