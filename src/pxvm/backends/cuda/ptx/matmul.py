"""Matrix products in PTX, float32: C (M, N) = A (M, K) @ B, B (K, N) or, with TRANSPOSE_B,
B (N, K).

- `naive`: one output per thread, its K products in a loop (the reference kernel).
- `tiled`: each block of 256 threads computes a TILE x TILE tile of C, each thread an
  8 x 8 piece of it in registers; K advances DEPTH values at a time through shared
  memory, A's and B's slices stored k-major so that a thread reads its 8 rows and 8
  columns as two 16-byte loads each. Loads past the matrices' edges are predicated off
  (zeros), so any M, N, K works.
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32

THREADS = 256
TILE = 128                 # C tile of a block: TILE x TILE
DEPTH = 8                  # K values per shared-memory step
PER_THREAD = 8             # a thread's C piece: PER_THREAD x PER_THREAD
SIDE = TILE // PER_THREAD  # threads along a tile's side (16 x 16 = THREADS)


def _name(kind: str, transpose_b: bool) -> str:
    return f"matmul_{kind}{'_bt' if transpose_b else ''}"


def naive(transpose_b: bool = False) -> Kernel:
    """C[i] for i = global thread index (grid-stride), row i / N, column i % N."""
    k = Kernel(_name("naive", transpose_b), [("a", "u64"), ("b", "u64"), ("c", "u64"),
                                              ("M", "u32"), ("N", "u32"), ("K", "u32")])
    a, b, c, M, N, K = k.params()
    i, stride = k.grid_stride()
    total = k.op("mul.lo.u32", M, N)
    with k.loop(i, total, stride):
        row = k.op("div.u32", i, N)
        col = k.op("rem.u32", i, N)
        acc = k.op("mov.f32", f32(0.0))
        j = k.op("mov.u32", 0)
        a_row = k.op("mul.lo.u32", row, K)
        with k.loop(j, K, 1):
            av = k.load("f32", k.element(a, k.op("add.u32", a_row, j), 4))
            b_index = (k.op("mad.lo.u32", col, K, j) if transpose_b
                       else k.op("mad.lo.u32", j, N, col))
            k.to(acc, "fma.rn.f32", av, k.load("f32", k.element(b, b_index, 4)), acc)
        k.store("f32", k.element(c, i, 4), acc)
    return k


class _Slices:
    """How one thread copies its part of each K slice of an operand into shared memory:
    four values, from a pointer that advances by `step` bytes a slice, with their
    bounds; ALIGNED kernels move them as one 16-byte load (their rows are whole groups
    of four, so the four are in or out of bounds together)."""

    def __init__(self, k: Kernel, src: Reg, ld: Reg, outer0: Reg, outer_n: Reg,
                 inner_n: Reg, tid: Reg, shared: Reg, k_major_rows: bool, aligned: bool):
        self.k, self.aligned = k, aligned
        if k_major_rows:
            # a (TILE x DEPTH) slice of a row-major matrix whose rows are this tile's
            # rows (outer) and whose columns are K (inner): two threads a row
            r = k.op("shr.u32", tid, 1)
            kk0 = k.op("shl.b32", k.op("and.b32", tid, 1), 2)
            self.outer_ok = k.setp("lt.u32", k.op("add.u32", outer0, r), outer_n)
            first = k.op("mad.lo.u32", k.op("add.u32", outer0, r), ld, kk0)
            self.inner = kk0                  # the first of the four K indices
            self.step = 4 * DEPTH
            self.slots = [k.op("mad.lo.u32", k.op("add.u32", kk0, q), 4 * TILE,
                               k.op("mad.lo.u32", r, 4, shared)) for q in range(4)]
            self.k_inner = True
        else:
            # a (DEPTH x TILE) slice of a row-major (K, cols) matrix: 32 threads a row
            kk = k.op("shr.u32", tid, 5)
            c0 = k.op("shl.b32", k.op("and.b32", tid, 31), 2)
            self.col_ok = [k.setp("lt.u32", k.op("add.u32", outer0, k.op("add.u32", c0, q)),
                                  outer_n) for q in range(4)]
            first = k.op("mad.lo.u32", kk, ld, k.op("add.u32", outer0, c0))
            self.inner = kk
            self.step = k.op("mul.wide.u32", ld, 4 * DEPTH)
            self.slots = [k.op("mad.lo.u32", kk, 4 * TILE,
                               k.op("mad.lo.u32", k.op("add.u32", c0, q), 4, shared))
                          for q in range(4)]
            self.k_inner = False
        self.inner_n = inner_n
        self.ptr = k.element(src, first, 4)

    def fetch(self, k0: Reg, values: list[Reg] | None = None) -> list[Reg]:
        """This thread's four values of the slice at K offset k0 (zeros out of bounds),
        into `values` (registers a loop reuses) or new registers."""
        k = self.k
        if values is None:
            values = [k.reg("f32") for _ in range(4)]
        for v in values:
            k.to(v, "mov.f32", f32(0.0))
        if self.k_inner:
            kk = k.op("add.u32", k0, self.inner)
            oks = [k.op("and.pred", self.outer_ok,
                        k.setp("lt.u32", k.op("add.u32", kk, q), self.inner_n))
                   for q in range(1 if self.aligned else 4)]
        else:
            row_ok = k.setp("lt.u32", k.op("add.u32", k0, self.inner), self.inner_n)
            oks = [k.op("and.pred", row_ok, ok) for ok in self.col_ok[:1 if self.aligned else 4]]
        if self.aligned:
            k.emit(f"@{oks[0]} ld.global.v4.f32 {{{', '.join(map(str, values))}}}, [{self.ptr}]")
        else:
            for q in range(4):
                k.to(values[q], "ld.global.f32", f"[{self.ptr}+{4 * q}]", pred=oks[q])
        return values

    def advance(self) -> None:
        self.k.to(self.ptr, "add.u64", self.ptr, self.step)

    def stash(self, values: list[Reg], offset: Reg | None = None) -> None:
        """The values into shared memory (`offset` bytes further: the other buffer)."""
        for slot, value in zip(self.slots, values):
            address = slot if offset is None else self.k.op("add.u32", slot, offset)
            self.k.store("f32", address, value, space="shared")


SLICE_BYTES = DEPTH * TILE * 4  # one operand's K slice in shared memory


def tiled(transpose_b: bool = False, aligned: bool = False) -> Kernel:
    """Block (x, y) computes C rows y*TILE.., columns x*TILE.. (grid ceil(N/TILE),
    ceil(M/TILE)). The next K slice is fetched from memory into registers while the
    current one is multiplied out of shared memory; two slices are kept in shared
    memory, the next stored while the current is read, so one barrier a slice suffices
    instead of two (faster than one slice and two barriers: docs/benchmarks-log.md). `aligned`:
    K and N are multiples of 4 (16-byte loads)."""
    k = Kernel(_name("tiled", transpose_b) + ("_aligned" if aligned else ""),
               [("a", "u64"), ("b", "u64"), ("c", "u64"), ("M", "u32"), ("N", "u32"),
                ("K", "u32")])
    a, b, c, M, N, K = k.params()
    a_tile = k.op("mov.u32", k.shared("a_tile", "f32", 2 * DEPTH * TILE, 16))
    b_tile = k.op("mov.u32", k.shared("b_tile", "f32", 2 * DEPTH * TILE, 16))
    tid = k.special("%tid.x")
    tx = k.op("and.b32", tid, SIDE - 1)
    ty = k.op("shr.u32", tid, 4)
    row0 = k.op("mul.lo.u32", k.special("%ctaid.y"), TILE)
    col0 = k.op("mul.lo.u32", k.special("%ctaid.x"), TILE)
    a_slices = _Slices(k, a, K, row0, M, K, tid, a_tile, True, aligned)
    b_slices = (_Slices(k, b, K, col0, N, K, tid, b_tile, True, aligned) if transpose_b
                else _Slices(k, b, N, col0, N, K, tid, b_tile, False, aligned))
    acc = [[k.op("mov.f32", f32(0.0)) for _ in range(PER_THREAD)] for _ in range(PER_THREAD)]
    # this thread's 8 rows and 8 columns within the k-major slices
    a_mine = k.op("mad.lo.u32", ty, 4 * PER_THREAD, a_tile)
    b_mine = k.op("mad.lo.u32", tx, 4 * PER_THREAD, b_tile)
    def multiply(a_at: Reg, b_at: Reg) -> None:
        for kk in range(DEPTH):
            offset = kk * 4 * TILE
            av = (k.load_vector("f32", f"{a_at}+{offset}", 4, "shared")
                  + k.load_vector("f32", f"{a_at}+{offset + 16}", 4, "shared"))
            bv = (k.load_vector("f32", f"{b_at}+{offset}", 4, "shared")
                  + k.load_vector("f32", f"{b_at}+{offset + 16}", 4, "shared"))
            for i in range(PER_THREAD):
                for j in range(PER_THREAD):
                    k.to(acc[i][j], "fma.rn.f32", av[i], bv[j], acc[i][j])

    k0 = k.op("mov.u32", 0)
    a_next, b_next = a_slices.fetch(k0), b_slices.fetch(k0)
    a_slices.stash(a_next)
    b_slices.stash(b_next)
    k.emit("bar.sync 0")
    parity = k.op("mov.u32", 0)  # the buffer holding the current slice
    with k.loop(k0, K, DEPTH):
        a_slices.advance()
        b_slices.advance()
        following = k.op("add.u32", k0, DEPTH)
        a_slices.fetch(following, a_next)
        b_slices.fetch(following, b_next)
        here = k.op("mul.lo.u32", parity, SLICE_BYTES)
        multiply(k.op("add.u32", a_mine, here), k.op("add.u32", b_mine, here))
        there = k.op("sub.u32", SLICE_BYTES, here)
        a_slices.stash(a_next, there)
        b_slices.stash(b_next, there)
        k.emit("bar.sync 0")
        k.to(parity, "xor.b32", parity, 1)
    for i in range(PER_THREAD):
        row = k.op("add.u32", row0, k.op("mad.lo.u32", ty, PER_THREAD, i))
        row_ok = k.setp("lt.u32", row, M)
        for j in range(PER_THREAD):
            col = k.op("add.u32", col0, k.op("mad.lo.u32", tx, PER_THREAD, j))
            ok = k.op("and.pred", row_ok, k.setp("lt.u32", col, N))
            address = k.element(c, k.op("mad.lo.u32", row, N, col), 4)
            k.emit(f"@{ok} st.global.f32 [{address}], {acc[i][j]}")
    return k


def variants():
    for transpose_b in (False, True):
        yield naive, (transpose_b,)
        for aligned in (False, True):
            yield tiled, (transpose_b, aligned)
