"""Batches' products with K-quant weights on Hopper's tensor cores (sm_90a): y (M, N) float32
= x (M, K) @ W^T for x float16 and W as GGUF rows (Q4_K, Q5_K), each weight byte read once
for all the rows of x a block takes (several sequences decoding together).

wgmma.py multiplies float16 copies of W, 3.5 times a Q4_K weight's bytes. Here W's blocks
are decoded into shared memory on the way: W is wgmma's A (a block's ROWS rows, 64 a
warpgroup) and x its B (`columns` rows of x, the instruction's N), so the accumulators
hold y's transpose and the epilogue stores them so.

K advances DEPTH (64) values a step, 4 a super-block (the loop's body, unrolled). cp.async
brings a step's x slice (in the 128-byte swizzle wgmma reads, as wgmma.py) and the block's
bytes of W for it `ahead` steps early into a ring of ahead + 2 stages: each row's 32 bytes
of the step's quants, and with a super-block's first step its 16-byte head of scales
(and Q5_K's 32 bytes of fifth bits). At that first step each thread decodes its row's 8
(scale, minimum) pairs into float16 registers for the super-block; at every step it
decodes 16 bytes of quants (32 values: half of sub-blocks 2c and 2c + 1) into a float16
W slice, two slices alternating, and the warpgroups multiply one while the next is
decoded. A quant u becomes float16 by its byte under the exponent byte 0x64 (1024 + u,
exactly), less 1024 (exact), then a u + b in one float16 fma, a = d sc and b = -dmin m
each an exact product rounded once to float16: about as far from the exact value as W's
float16 copy is.

`epilogue`: "add" adds a residual (M, N); a GLU activation (silu, gelu_tanh) makes W =
[gate; up] (N rows, N / 2 outputs) and y = act(x gate^T) * (x up^T): of each 16 rows of
the block (a warp's accumulator rows) 8 are gate rows and 8 the same rows of up, so a
thread holds the gate and the up sums of the same outputs. `split`: as wgmma.py's, block
z multiplies range z of K's steps into slice z of a workspace (splits, M, N), which
wgmma.split_sum adds up.
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32
from .elementwise import _unary_math
from .quant_blocks import FORMATS
from .wgmma import _descriptor, swizzle_base

ARCH = "sm_90a"
ROWS = 128                  # W rows a block: 64 a warpgroup
THREADS = 256               # a unit of a step a thread: ROWS rows x 2 units
DEPTH = 64                  # K values a step
ROW_BYTES = DEPTH * 2       # a float16 slice row: one 128-byte swizzle row
SLICE_BYTES = ROWS * ROW_BYTES
#: the types it decodes: those whose 64 values of a step are 32 bytes of one super-block's
#: quants, in sub-blocks 2c and 2c + 1 (Q5_K with its fifth bits)
TYPES = ("Q4_K", "Q5_K")
#: rows of x a block takes (wgmma's N): the op picks the smallest holding the batch
COLUMNS = (8, 16, 32, 64, 128)
#: steps whose copies are in flight while one is decoded and multiplied
AHEAD = 3
EPILOGUES = ("none", "add", "silu", "gelu_tanh")
F16_1024 = "0x64006400"     # 1024.0 in both halves


def staged_fields(qtype: str) -> tuple[tuple[str, int], ...]:
    """(field, offset in the staged record) of what a row stages a step: each field's
    16-byte chunks as in the GGUF block but the quants, of which only the step's 32
    bytes."""
    if qtype == "Q4_K":
        return (("head", 0), ("qs", 16))
    if qtype == "Q5_K":
        return (("head", 0), ("qh", 16), ("qs", 48))
    raise ValueError(f"no tensor-core batch kernel for {qtype}; it decodes {TYPES}")


def record_bytes(qtype: str) -> int:
    """Bytes a row stages a step (the head, Q5_K's fifth bits, the step's quants)."""
    return staged_fields(qtype)[-1][1] + 32


def stage_bytes(qtype: str, columns: int) -> int:
    """A stage: the x slice (columns rows of 128 bytes), then the rows' staged records;
    both whole 1024-byte swizzle atoms."""
    return columns * ROW_BYTES + ROWS * record_bytes(qtype)


def shared_bytes(qtype: str, columns: int, ahead: int = AHEAD) -> int:
    """Dynamic shared memory of a block: ahead + 2 stages, two float16 W slices, and the
    1024-byte alignment the swizzle needs."""
    return (ahead + 2) * stage_bytes(qtype, columns) + 2 * SLICE_BYTES + 1024


def _weight_row(k: Kernel, r: Reg, glu: bool, N: Reg) -> tuple[Reg, Reg]:
    """(the W row of the block's row r, whether W has it): the block's ROWS rows in
    order, or for a GLU 8 gate rows then the same 8 of up in each 16."""
    if not glu:
        row = k.op("mad.lo.u32", k.special("%ctaid.x"), ROWS, r)
        return row, k.setp("lt.u32", row, N)
    half = k.op("shr.u32", N, 1)
    output = k.op("add.u32", k.op("mul.lo.u32", k.special("%ctaid.x"), ROWS // 2),
                  k.op("add.u32", k.op("shl.b32", k.op("shr.u32", r, 4), 3),
                       k.op("and.b32", r, 7)))
    up = k.op("selp.u32", half, 0, k.setp("ne.u32", k.op("and.b32", r, 8), 0))
    return k.op("add.u32", output, up), k.setp("lt.u32", output, half)


class _Copy:
    """One 16-byte cp.async a thread queues each step (or each super-block's first):
    from `src` + the step's offset into the stage at `dst`, where `held` (zeros
    elsewhere: past W's or x's rows, or a step past the block's range). Only threads
    that have the chunk (`exists`) issue it at all: a zero-size copy still writes its 16
    bytes of zeros, and a chunk past the slice's end lies in the records after it."""

    def __init__(self, src: Reg, dst: Reg, held: Reg, exists: Reg):
        self.src, self.dst, self.held, self.exists = src, dst, held, exists

    def emit(self, k: Kernel, offset: Reg, stage: Reg, live: Reg) -> None:
        ok = k.op("and.pred", self.held, live)
        src = k.op("add.u64", self.src, k.op("selp.u64", offset, 0, ok))
        size = k.op("selp.u32", 16, 0, ok)
        k.emit(f"@{self.exists} cp.async.cg.shared.global "
               f"[{k.op('add.u32', stage, self.dst)}], [{src}], 16, {size}")


def _copies(k: Kernel, qtype: str, w: Reg, x: Reg, M: Reg, K: Reg, tid: Reg, col0: Reg,
            columns: int, block_rows) -> tuple[list[_Copy], list[_Copy], list[_Copy]]:
    """A thread's copies of a step: (x's chunks, the quants' chunks, the chunks of the
    head and Q5_K's fifth bits, copied with a super-block's first step only); their
    sources at step 0 of W's row (clamped to row 0 where not held)."""
    fmt = FORMATS[qtype]
    row_bytes = k.op("mul.lo.u32", k.op("shr.u32", K, 8), fmt.block_bytes)
    record = record_bytes(qtype)
    quants = dict(staged_fields(qtype))["qs"]

    def chunk(count: int, per_row: int, part: int):
        """(row, chunk in it, whether the thread has one) of part `part`'s chunk."""
        at = k.op("add.u32", tid, part * THREADS)
        r = k.op("div.u32", at, per_row) if per_row > 1 else at
        q = k.op("sub.u32", at, k.op("mul.lo.u32", r, per_row))
        return r, q, k.setp("lt.u32", at, count)

    def w_copy(r, q_bytes, exists, quant: bool) -> _Copy:
        wrow, held = block_rows(r)
        ok = k.op("and.pred", held, exists)
        within = k.op("add.u32", q_bytes, quants if quant else 0)
        src = k.op("add.u64", w, k.op("mul.wide.u32", k.op("selp.u32", wrow, 0, ok), row_bytes))
        src = k.op("add.u64", src, k.op("cvt.u64.u32", within))
        dst = k.op("add.u32", k.op("mad.lo.u32", r, record, columns * ROW_BYTES), within)
        return _Copy(src, dst, ok, exists)

    xs = []
    for part in range(-(-columns * 8 // THREADS)):
        r, c, exists = chunk(columns * 8, 8, part)
        row = k.op("add.u32", col0, r)
        ok = k.op("and.pred", k.setp("lt.u32", row, M), exists)
        src = k.op("add.u64", x, k.op("mul.wide.u32", k.op("selp.u32", row, 0, ok),
                                      k.op("shl.b32", K, 1)))
        src = k.op("add.u64", src, k.op("cvt.u64.u32", k.op("shl.b32", c, 4)))
        dst = k.op("mad.lo.u32", r, ROW_BYTES, k.op("shl.b32", k.op("xor.b32", c, k.op(
            "and.b32", r, 7)), 4))
        xs.append(_Copy(src, dst, ok, exists))
    r, q, exists = chunk(ROWS * 2, 2, 0)  # the step's 32 bytes of quants: 2 chunks a row
    quant_copies = [w_copy(r, k.op("shl.b32", q, 4), exists, True)]
    head_chunks = quants // 16
    heads = []
    for part in range(-(-ROWS * head_chunks // THREADS)):
        r, q, exists = chunk(ROWS * head_chunks, head_chunks, part)
        heads.append(w_copy(r, k.op("shl.b32", q, 4), exists, False))
    return xs, quant_copies, heads


def _scales(k: Kernel, head: list[Reg], constants) -> tuple[list[Reg], list[Reg]]:
    """The 8 sub-blocks' (scale, offset) of a K4 super-block as float16 pairs (a, a) and
    (b, b), value = a u + b: a = d sc, b = -dmin m, each exact product rounded once."""
    exponent, f16_1024 = constants
    h0, h1, h2, h3 = head
    d = k.op("prmt.b32", h0, h0, 0x1010)
    minus_dmin = k.op("xor.b32", k.op("prmt.b32", h0, h0, 0x3232), "0x80008000")
    six, top, low = "0x3F3F3F3F", "0x30303030", "0x0F0F0F0F"
    sc = [k.op("and.b32", h1, six),
          k.op("or.b32", k.op("and.b32", h3, low), k.op("and.b32", k.op("shr.u32", h1, 2), top))]
    mn = [k.op("and.b32", h2, six),
          k.op("or.b32", k.op("and.b32", k.op("shr.u32", h3, 4), low),
               k.op("and.b32", k.op("shr.u32", h2, 2), top))]
    a, b = [], []
    for i in range(8):
        byte = i % 4
        selector = byte | 4 << 4 | byte << 8 | 4 << 12  # the byte under 0x64, twice
        for words, factor, out in ((sc, d, a), (mn, minus_dmin, b)):
            small = k.op("sub.rn.f16x2", k.op("prmt.b32", words[i // 4], exponent, selector),
                         f16_1024)
            out.append(k.op("mul.rn.f16x2", small, factor))
    return a, b


def _decode(k: Kernel, qtype: str, record: Reg, c: int, h: Reg, scales, fifth,
            slice_: Reg, stores: list[Reg], constants) -> None:
    """The thread's unit of step c of the super-block: 16 bytes of quants (h's half of the
    step's 32) into 32 float16 values, sub-block 2c's (the low nibbles) and 2c + 1's."""
    exponent, f16_1024 = constants
    quants = dict(staged_fields(qtype))["qs"]
    words = k.load_vector("b32", k.op("add.u32", record, k.op("add.u32", k.op(
        "shl.b32", h, 4), quants)), space="shared")
    low = [k.op("and.b32", word, "0x0F0F0F0F") for word in words]
    high = [k.op("and.b32", k.op("shr.u32", word, 4), "0x0F0F0F0F") for word in words]
    if fifth is not None:  # bit 2c (low) and 2c + 1 (high) of each value's qh byte
        low = [k.op("or.b32", word, k.op("shl.b32", k.op("and.b32", k.op(
            "shr.u32", bits, 2 * c), "0x01010101"), 4)) for word, bits in zip(low, fifth)]
        high = [k.op("or.b32", word, k.op("shl.b32", k.op("and.b32", k.op(
            "shr.u32", bits, 2 * c + 1), "0x01010101"), 4)) for word, bits in zip(high, fifth)]
    a, b = scales
    for group, part in enumerate((low, high)):
        halves = []
        for word in part:
            for selector in (0x4140, 0x4342):  # bytes 0, 1 / 2, 3 under 0x64
                u = k.op("sub.rn.f16x2", k.op("prmt.b32", word, exponent, selector), f16_1024)
                halves.append(k.op("fma.rn.f16x2", u, a[2 * c + group], b[2 * c + group]))
        for half in range(2):
            at = k.op("add.u32", slice_, stores[2 * group + half])
            k.store_vector("b32", at, halves[4 * half: 4 * half + 4], space="shared")


def _next(k: Kernel, index: Reg, stages: int) -> None:
    """index = (index + 1) mod stages, in place."""
    k.to(index, "add.u32", index, 1)
    k.to(index, "selp.u32", 0, index, k.setp("eq.u32", index, stages))


def matmul_quant_wgmma(qtype: str, columns: int = 64, ahead: int = AHEAD,
                       epilogue: str = "none", split: bool = False) -> Kernel:
    """The kernel of one type, width and epilogue. Parameters: x (M, K) float16, W (N
    GGUF rows of K values), y (M, N) float32 (M, N / 2 for a GLU; the workspace with
    `split`), M, N, K (a multiple of 256) [, the residual (M, N)]. Grid: (blocks of
    ROWS W rows (ROWS / 2 outputs for a GLU), blocks of `columns` x rows, splits)."""
    glu = epilogue in ("silu", "gelu_tanh")
    if columns not in COLUMNS or epilogue not in EPILOGUES or not 1 <= ahead <= 4:
        raise ValueError(f"no {qtype} tensor-core batch kernel of {columns} columns, "
                         f"{ahead} ahead, epilogue {epilogue}")
    if split and epilogue != "none":
        raise ValueError("a split product's slices are summed by split_sum (which adds the "
                         "residual); a GLU's epilogue needs whole sums")
    fmt = FORMATS[qtype]
    stages = ahead + 2
    sbytes = stage_bytes(qtype, columns)
    residual = epilogue == "add"
    k = Kernel(f"matmul_{qtype.lower()}_wgmma_{columns}x{ahead}"
               f"{'' if epilogue == 'none' else '_' + epilogue}{'_split' if split else ''}",
               [("x", "u64"), ("w", "u64"), ("y", "u64"), ("M", "u32"), ("N", "u32"),
                ("K", "u32"), *([("r", "u64")] if residual else [])], arch=ARCH)
    x, w, y, M, N, K, *rest = k.params()
    buffers = swizzle_base(k)
    slices = [k.op("add.u32", buffers, stages * sbytes + i * SLICE_BYTES) for i in range(2)]
    tid = k.special("%tid.x")
    group = k.op("shr.u32", tid, 7)
    col0 = k.op("mul.lo.u32", k.special("%ctaid.y"), columns)
    acc = [k.op("mov.f32", f32(0.0)) for _ in range(columns // 2)]
    accumulate = k.setp("eq.u32", 0, 0)
    blocks = k.op("shr.u32", K, 8)  # super-blocks a row: 4 steps each
    first, end = k.op("mov.u32", 0), blocks
    if split:  # whole super-blocks a range
        z = k.special("%ctaid.z")
        splits = k.special("%nctaid.z")
        per = k.op("div.u32", k.op("add.u32", blocks, k.op("sub.u32", splits, 1)), splits)
        first = k.op("min.u32", blocks, k.op("mul.lo.u32", z, per))
        end = k.op("min.u32", blocks, k.op("add.u32", first, per))
        y = k.element(y, k.op("mul.lo.u32", z, k.op("mul.lo.u32", M, N)), 4)
    constants = (k.op("or.b32", k.op("shr.u32", tid, 10), 0x64646464),  # quant_blocks._exponent
                 k.op("or.b32", k.op("shr.u32", tid, 10), F16_1024))
    xs, quant_copies, heads = _copies(k, qtype, w, x, M, K, tid, col0, columns,
                                      lambda r: _weight_row(k, r, glu, N))
    r, h = k.op("shr.u32", tid, 1), k.op("and.b32", tid, 1)
    record = k.op("mad.lo.u32", r, record_bytes(qtype), columns * ROW_BYTES)
    swizzle = k.op("and.b32", r, 7)
    row = k.op("mul.lo.u32", r, ROW_BYTES)
    stores = [k.op("add.u32", row, k.op("shl.b32", k.op("xor.b32", k.op(
        "add.u32", k.op("shl.b32", h, 1), 4 * g + half), swizzle), 4))
              for g in range(2) for half in range(2)]
    a_descriptors = [_descriptor(k, k.op("mad.lo.u32", group, 64 * ROW_BYTES, s)) for s in slices]

    def copy_step(sb: Reg, c: int, stage_index: Reg) -> None:
        """Queue step 4 sb + c's copies (zeros past the range) into stage stage_index."""
        stage = k.op("mad.lo.u32", stage_index, sbytes, buffers)
        live = k.setp("lt.u32", sb, end)
        step_bytes = k.op("cvt.u64.u32", k.op("shl.b32", k.op("mad.lo.u32", sb, 4, c), 7))
        block_bytes = k.op("mul.wide.u32", sb, fmt.block_bytes)
        for copy in xs:
            copy.emit(k, step_bytes, stage, live)
        for copy in quant_copies:
            copy.emit(k, k.op("add.u64", block_bytes, 32 * c), stage, live)
        if c == 0:
            for copy in heads:
                copy.emit(k, block_bytes, stage, live)
        k.emit("cp.async.commit_group")

    current, later = k.op("mov.u32", 0), k.op("mov.u32", ahead)
    for c in range(ahead):
        copy_step(first, c, k.op("mov.u32", c))
    sb = k.op("mov.u32", first)
    scales = fifth = None
    with k.loop(sb, end, 1):
        for c in range(4):
            k.emit(f"cp.async.wait_group {ahead - 1}")
            k.emit("bar.sync 0")  # the step's copies landed; the previous step decoded
            copy_step(k.op("add.u32", sb, (c + ahead) // 4), (c + ahead) % 4, later)
            stage = k.op("mad.lo.u32", current, sbytes, buffers)
            rec = k.op("add.u32", stage, record)
            if c == 0:
                scales = _scales(k, k.load_vector("b32", rec, space="shared"), constants)
                if qtype == "Q5_K":
                    fifth = k.load_vector("b32", k.op("add.u32", rec, k.op(
                        "add.u32", k.op("shl.b32", h, 4), 16)), space="shared")
            _decode(k, qtype, rec, c, h, scales, fifth, slices[c % 2], stores, constants)
            # the stores and copies were made through the generic proxy, wgmma reads
            # through the async one
            k.emit("fence.proxy.async.shared::cta")
            k.emit("bar.sync 0")
            b_descriptor = _descriptor(k, stage)
            k.emit("wgmma.fence.sync.aligned")
            for s in range(DEPTH // 16):  # k16 products: 32 bytes (2 in a descriptor) on
                da = k.op("add.s64", a_descriptors[c % 2], 2 * s)
                db = k.op("add.s64", b_descriptor, 2 * s)
                k.emit(f"wgmma.mma_async.sync.aligned.m64n{columns}k16.f32.f16.f16 "
                       f"{{{', '.join(map(str, acc))}}}, {da}, {db}, {accumulate}, 1, 1, 0, 0")
            k.emit("wgmma.commit_group.sync.aligned")
            # the slice decoded next was read by the group before this one
            k.emit("wgmma.wait_group.sync.aligned 1")
            _next(k, current, stages)
            _next(k, later, stages)
    k.emit("wgmma.wait_group.sync.aligned 0")
    k.emit("cp.async.wait_group 0")
    _store(k, y, acc, M, N, tid, group, col0, columns, epilogue, rest[0] if residual else None)
    return k


def _store(k: Kernel, y: Reg, acc: list[Reg], M: Reg, N: Reg, tid: Reg, group: Reg,
           col0: Reg, columns: int, epilogue: str, residual) -> None:
    """y's transpose from the accumulators: warp w of warpgroup g holds the block's rows
    64 g + 16 w .. + 15; for each 8 columns j, a lane's registers 4j, 4j + 1 are row l / 4
    of them, columns 8j + 2 (l % 4) + 0, 1, and 4j + 2, 4j + 3 the row 8 further."""
    warp = k.op("and.b32", k.op("shr.u32", tid, 5), 3)
    lane = k.op("and.b32", tid, 31)
    first_col = k.op("add.u32", col0, k.op("shl.b32", k.op("and.b32", lane, 3), 1))
    in_block = k.op("add.u32", k.op("shl.b32", warp, 4), k.op("shr.u32", lane, 2))
    if epilogue in ("silu", "gelu_tanh"):  # gate row l / 4, up row l / 4 + 8
        outputs = k.op("shr.u32", N, 1)
        out = k.op("add.u32", k.op("mul.lo.u32", k.special("%ctaid.x"), ROWS // 2), k.op(
            "add.u32", k.op("shl.b32", group, 5),
            k.op("add.u32", k.op("shl.b32", warp, 3), k.op("shr.u32", lane, 2))))
        with k.if_(k.setp("lt.u32", out, outputs)):
            for j in range(columns // 8):
                for e in range(2):
                    col = k.op("add.u32", first_col, 8 * j + e)
                    gate, up = acc[4 * j + e], acc[4 * j + 2 + e]
                    value = k.op("mul.f32", _unary_math(k, epilogue, gate, gate, gate), up)
                    at = k.element(y, k.op("mad.lo.u32", col, outputs, out), 4)
                    k.emit(f"@{k.setp('lt.u32', col, M)} st.global.f32 [{at}], {value}")
        return
    top = k.op("add.u32", k.op("mad.lo.u32", k.special("%ctaid.x"), ROWS,
                                k.op("shl.b32", group, 6)), in_block)
    for half in range(2):
        out = k.op("add.u32", top, 8 * half)
        with k.if_(k.setp("lt.u32", out, N)):
            for j in range(columns // 8):
                for e in range(2):
                    col = k.op("add.u32", first_col, 8 * j + e)
                    index = k.op("mad.lo.u32", col, N, out)
                    inside = k.setp("lt.u32", col, M)
                    value = acc[4 * j + 2 * half + e]
                    if residual is not None:
                        added = k.reg("f32")
                        k.emit(f"@{inside} ld.global.f32 {added}, "
                               f"[{k.element(residual, index, 4)}]")
                        value = k.op("add.f32", value, added)
                    k.emit(f"@{inside} st.global.f32 [{k.element(y, index, 4)}], {value}")


def variants():
    for qtype in TYPES:
        for columns in COLUMNS:
            for epilogue in EPILOGUES:
                yield matmul_quant_wgmma, (qtype, columns, AHEAD, epilogue)
            yield matmul_quant_wgmma, (qtype, columns, AHEAD, "none", True)
