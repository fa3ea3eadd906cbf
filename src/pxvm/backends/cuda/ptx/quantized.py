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
(`prefetch`); "bulk" does so before the kernel waits for its predecessor (a dependent
launch: decoding's graphs), while that one is still running; "stage" copies them into
shared memory then (Hopper's bulk copies, a barrier a group of rows; the last group
only after the wait for LATE_GROUP_TYPES), and the products read them there; "ring"
stages half the groups so and refills each group's slot with the group half the block
further once its rows are multiplied (blocks half the size, for weights too large to
stage whole beside the next product's). Types whose blocks are not 16-byte aligned are
read repacked into planes (`repack`, once per weight; the op keeps them).

A transformer's ops around the product go into the same launch (`FUSIONS`): the RMS norm
of x before it (`norm`), and after it the residual's add or a GLU (`epilogue`).

`matvec_float_scalar`: F32, F16, BF16 weights whose K is not a multiple of 32 (their rows
are not 16-byte aligned): a warp an output, a value a lane at a time.

Its length is `matvec`: the prefetch modes and fusions are variants of one loop, kept in
one builder so that a change to the loop reaches every variant.
"""

from __future__ import annotations

import contextlib
from math import gcd

from .builder import Kernel, f32
from .elementwise import _unary_math
from .quant_blocks import (FORMATS, UNIT, Planes, SharedRows, bulk_prefetch, load_half, load_words,
                           source, staging_fits, store_words, unit)

THREADS = 256
WARPS = THREADS // 32
#: threads of a matvec block at most: with up to 255 registers a thread, a block of 256
#: still fits a multiprocessor's 65,536 (the launch fails beyond)
MAX_THREADS = 256
#: warps a block can have (the shared partial sums are sized for any block)
MAX_WARPS = 32
#: (outputs a block, rows a group) of `matvec`: the shapes the H100 benchmark sweeps
SHAPES = ((4, 4), (8, 4), (8, 8), (16, 4), (16, 8), (16, 16))
#: the shape every type has (the op launches it unless told otherwise)
DEFAULT_SHAPE = (8, 8)
#: the shape of every type's "stage" kernel (ops.quantized launches it where a weight's
#: rows are staged)
STAGED_SHAPE = (16, 4)
#: the shape of every type's "ring" kernel (ops.quantized launches it where a weight's
#: rows stream through a ring)
RING_SHAPE = (16, 4)
#: how `matvec` asks for its weights ahead of the loads: "bulk" (Hopper's bulk prefetch:
#: one instruction a plane asks L2 for all the block's rows as the block starts; the
#: module's target is then sm_90a, as wgmma's), "lines" (each thread prefetches its
#: units' lines to L2 before loading them), "none", "stage" (Hopper's bulk copies bring
#: the block's rows into shared memory as it starts, a group of rows at a time, and the
#: products read them there), "ring" (as "stage", in slots for half the groups: each
#: group's slot takes the group half the block further once its rows are multiplied;
#: blocks half the size, for weights too large to stage whole beside the next product's)
PREFETCHES = ("bulk", "lines", "none", "stage", "ring")
#: the prefetches that stage rows in shared memory
STAGING = ("stage", "ring")
#: the types whose staging blocks ("stage", "ring") queue the copy of the last group of
#: rows they hold at once only after their wait for the previous kernel, the others'
#: before it: the previous kernel's end, which the wait waits for, came later the more
#: copies were queued ahead of it; these types were measured faster so (Q4_K, Q5_K,
#: Q6_K), Q8_0 and Q4_0 not (docs/benchmarks-log.md, "The last group after the wait")
LATE_GROUP_TYPES = ("Q4_K", "Q5_K", "Q6_K")
#: shared memory a block may stage its rows in (the H100 has 227 KiB a block)
MAX_STAGED_BYTES = 200 * 1024
#: the types whose SHAPES are all emitted (the ones benchmarked)
SWEPT = ("Q4_K", "Q8_0", "Q4_0", "Q6_K", "Q5_K")
#: what `matvec` stores: the product, residual + product ("add"), or act(gate) * up of a
#: GLU whose activation is named
EPILOGUES = ("none", "add", "silu", "gelu_tanh")
GLU_ACTIVATIONS = ("silu", "gelu_tanh")
#: the (norm, epilogue) pairs `matvec` is emitted with: the plain product, and the
#: transformer's fused ops (rmsnorm_matmul_quant, matmul_quant_add, rmsnorm_glu_quant)
FUSIONS = ((False, "none"), (True, "none"), (False, "add"), (True, "silu"),
           (True, "gelu_tanh"))
FLOAT_BYTES = {"F32": 4, "F16": 2, "BF16": 2}


def threads_for(k: int, prefetch: str = "none") -> int:
    """Threads of a matvec block for rows of k values: a unit each in one pass where
    MAX_THREADS allow (always for "ring", whose rows are multiplied in one pass: at most
    MAX_RING_THREADS), else as few passes as they allow with the units spread evenly over
    them; in whole warps."""
    units = k // UNIT
    passes = 1 if prefetch == "ring" else max(1, -(-units // MAX_THREADS))
    return max(32, -(-units // (32 * passes)) * 32)


#: threads of a "ring" matvec block at most (K <= 12,288): its registers are capped
#: (RING_REGISTERS) so that two such blocks fit a multiprocessor, this product's and the
#: next's
MAX_RING_THREADS = 384
RING_REGISTERS = 65536 // (2 * MAX_RING_THREADS) // 8 * 8


def staged_rows(rows: int, prefetch: str) -> int:
    """The rows of a matvec block of `rows` that are staged in shared memory at once."""
    return {"stage": rows, "ring": rows // 2}.get(prefetch, 0)


def staged_bytes(qtype: str, rows: int, k: int, prefetch: str = "stage") -> int:
    """Shared memory (dynamic) of a matvec block of `rows` rows of k values."""
    fmt = FORMATS[qtype]
    return staged_rows(rows, prefetch) * (k // fmt.block_values) * fmt.block_bytes


def stages(qtype: str, rows: int, k: int, prefetch: str = "stage") -> bool:
    """Whether a matvec block of `rows` rows of k values staging them (`prefetch`) can be
    launched: rows the bulk copies can take (quant_blocks.staging_fits) in
    MAX_STAGED_BYTES, and for a ring one pass of at most MAX_RING_THREADS threads."""
    return (staging_fits(FORMATS[qtype], k)
            and staged_bytes(qtype, rows, k, prefetch) <= MAX_STAGED_BYTES
            and (prefetch != "ring" or threads_for(k, prefetch) <= MAX_RING_THREADS))


def ring_takes(rows: int, group: int, prefetch: str) -> bool:
    """Whether a matvec block of `rows` in groups of `group` can be that prefetch's: a
    ring stages half of the groups at once, so it needs two at least."""
    return prefetch != "ring" or rows // group >= 2


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


def matvec(qtype: str, rows: int = 8, group: int = 8, prefetch: str = "bulk",
           norm: bool = False, epilogue: str = "none") -> Kernel:
    """Grid (ceil(N / outputs), M), block threads_for(K): block (b, m) computes outputs
    b * outputs .. of x row m, outputs = rows (rows / 2 for a GLU). Parameters: x, the
    weight (one pointer, or a plane a field for the repacked types), y, N, K; then gain
    and eps with `norm`, residual with the "add" epilogue. `prefetch`: PREFETCHES
    (ptxas moves each load down to its first use where registers are short, so that
    loads issued together in the PTX do not stay together; prefetches put the bytes in
    L2 ahead of them). "stage" copies the block's rows into shared memory (dynamic:
    staged_bytes) before the wait, so that the weight streams in while the previous
    kernel ends (for LATE_GROUP_TYPES the last group's rows after it); then x's values
    are loaded, and each group's rows read from shared memory once they have landed (a
    GLU's groups are then gate rows or up rows). "ring" stages the first half of the
    groups so, then, as each group's rows are multiplied (all the threads past them: a
    barrier), copies the group half the block further into its slot, counted on the
    same barrier's next phase; its threads take a unit each in one pass (threads_for).

    `norm`: y = rmsnorm(x, gain, eps) @ W^T, computed as ((x * gain) @ W^T) * s with
    s = rsqrt(mean(x^2) + eps): an output is linear in x, so s can wait for the end,
    and the threads sum x^2 from the values they load for the products anyway (the
    units partition the row: each value is loaded once), the block adding those sums up
    with the products'. `epilogue` (EPILOGUES): "add" stores residual[m, n] + y; a GLU's
    W holds 2N rows (the gate's N, then the up projection's), a block's rows are rows / 2
    gate rows and the same rows / 2 up rows, and it stores act(gate) * up."""
    glu = epilogue in GLU_ACTIVATIONS
    staged = prefetch in STAGING
    if rows & (rows - 1) or rows > 32 or rows % group or (glu and rows < 2):
        raise ValueError(f"rows must be a power of two <= 32 (>= 2 for a GLU) and a "
                         f"multiple of group, got {rows}, {group}")
    if staged and glu and group > rows // 2:
        raise ValueError(f"a staged GLU's groups are gate rows or up rows, not both: "
                         f"group must be at most {rows // 2}, got {group}")
    if not ring_takes(rows, group, prefetch):
        raise ValueError(f"a ring stages half of the groups at once: rows must be at least "
                         f"two groups, got {rows}, {group}")
    if epilogue not in EPILOGUES:
        raise ValueError(f"epilogue must be one of {', '.join(EPILOGUES)}, got {epilogue!r}")
    fmt = FORMATS[qtype]
    reader = unit(fmt)
    ring = prefetch == "ring"
    src = source(fmt, fmt.planes)
    groups = rows // group
    resident = staged_rows(rows, prefetch) // group  # groups in shared memory at once
    if staged:
        src = SharedRows(src, resident * group)
    fused = ("_norm" if norm else "") + ("" if epilogue == "none" else f"_{epilogue}")
    extras = ([("gain", "u64"), ("eps", "f32")] if norm else []) + \
        ([("residual", "u64")] if epilogue == "add" else [])
    k = Kernel(f"matvec_{fmt.label}_r{rows}_g{group}_{prefetch}{fused}",
               [("x", "u64"), *src.params(), ("y", "u64"), ("N", "u32"), ("K", "u32"),
                *extras], arch={"bulk": "sm_90a", "stage": "sm_90", "ring": "sm_90"}.get(prefetch),
               max_registers=RING_REGISTERS if ring else None)
    x, *rest = k.params()
    fields = len(src.params())
    pointers, (y, N, K), extra = rest[:fields], rest[fields:fields + 3], rest[fields + 3:]
    gain, eps = extra[:2] if norm else (None, None)
    residual = extra[-1] if epilogue == "add" else None
    src.bind(k, pointers, K)
    partial = k.op("mov.u32", k.shared("partial", "f32", MAX_WARPS * rows, 16))
    tid = k.special("%tid.x")
    threads = k.special("%ntid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    outputs = rows // 2 if glu else rows
    first = k.op("mul.lo.u32", k.special("%ctaid.x"), outputs)
    m = k.special("%ctaid.y")
    # rows past N read the last row again (and are not stored); a GLU's up rows are the
    # gate rows' N further
    last = k.op("sub.u32", N, 1)
    columns = [k.op("min.u32", k.op("add.u32", first, r), last) for r in range(outputs)]
    ns = columns + [k.op("add.u32", c, N) for c in columns] if glu else columns
    block_rows = k.op("sub.u32", k.op("min.u32", k.op("add.u32", first, outputs), N), first)
    if staged:  # staged rows are loaded from their slots: gate rows' first, then up rows'
        slots = [k.op("sub.u32", c, first) for c in columns]
        slots += [k.op("add.u32", slot, outputs) for slot in slots] if glu else []
        if ring:  # group g's rows in the slots of group g % resident
            slots = [(i // group % resident) * group + i % group for i in range(rows)]
        late = int(qtype in LATE_GROUP_TYPES and resident > 1)  # groups queued after the wait
        barriers, row_bytes = _stage_rows(k, src, tid, first, block_rows, N, resident,
                                          group, outputs, resident - late)
    x_row = k.element(x, k.op("mul.lo.u32", m, K), 4)
    units = k.op("shr.u32", K, 5)
    acc = [k.op("mov.f32", f32(0.0)) for _ in range(rows)]
    squares = k.op("mov.f32", f32(0.0)) if norm else None  # this thread's sum of x^2
    if prefetch == "bulk":  # one thread asks for every row of the block
        with k.if_(k.setp("eq.u32", tid, 0)):
            for start in [first, k.op("add.u32", first, N)] if glu else [first]:
                for address, nbytes in src.spans(k, start, block_rows):
                    bulk_prefetch(k, address, nbytes)
    # the weight's trip from memory overlaps the previous kernel's end (its prefetch
    # above); x, the gain and the residual may be its output
    k.wait_for_predecessors()
    if staged and late:
        with k.if_(k.setp("eq.u32", tid, 0)):
            for g in range(resident - late, resident):
                _copy_group(k, src, g, g, barriers, first, block_rows, N, group, outputs,
                            row_bytes)
    if ring:  # one pass: threads past the units take the last one, and count for nothing
        u = k.op("min.u32", tid, k.op("sub.u32", units, 1))
        body = contextlib.nullcontext()
    else:
        u = k.op("mov.u32", tid)
        body = k.loop(u, units, threads)
    with body:
        prep = reader.prepare(k, u)
        if prefetch == "lines":
            src.prefetching = True
            for n in ns:
                reader.load(k, src, n, prep)
            src.prefetching = False

        def loads(g):
            if staged:  # once its rows have landed
                k.barrier_wait(_landed(barriers, g % resident), g // resident & 1)
                return [reader.load(k, src, slots[r], prep)
                        for r in range(g * group, (g + 1) * group)]
            return [reader.load(k, src, ns[r], prep) for r in range(g * group, (g + 1) * group)]

        # the weights first: their loads take longest (staged, x's come first: its rows
        # may still be landing)
        pending = None if staged else loads(0)
        xs, raw = [], []
        for start, count in prep.segments:
            address = k.element(x_row, start, 4)
            gains = k.element(gain, start, 4) if norm else None
            for q in range(count // 4):
                regs = k.load_vector("f32", f"{address}+{16 * q}")
                if norm:  # the products take x * gain (the sums by group too)
                    raw += regs
                    regs = [k.op("mul.f32", v, g)
                            for v, g in zip(regs, k.load_vector("f32", f"{gains}+{16 * q}"))]
                xs += regs
        terms = reader.x_terms(k, xs)
        for g in range(groups):
            if pending is None:
                pending = loads(g)
            following = loads(g + 1) if g + 1 < groups and not staged else None
            these = acc[g * group:(g + 1) * group]
            for a, total in zip(these, reader.dot_rows(k, pending, prep, terms, these)):
                k.to(a, "mov.f32", total)
            pending = following
            if ring and g + resident < groups:  # its slot takes the group further on
                k.emit("bar.sync 0")
                with k.if_(k.setp("eq.u32", tid, 0)):
                    # the threads' reads of the slot come before the copy's writes
                    k.emit("fence.proxy.async.shared::cta")
                    _copy_group(k, src, g + resident, g % resident, barriers, first,
                                block_rows, N, group, outputs, row_bytes)
        # x^2 after the products: ptxas then issues the weights' loads earlier
        for v in raw:
            k.to(squares, "fma.rn.f32", v, v, squares)
    if ring:
        live = k.setp("lt.u32", tid, units)
        for a in acc + ([squares] if norm else []):
            k.to(a, "selp.f32", a, f32(0.0), live)
    # lanes past the last unit skipped the loop: the shuffles need the whole warp back
    # (with the staged rows' waits in the loop, lanes past the row's units reached them
    # first and read their partners' values before those were written: H100)
    k.emit("bar.warp.sync 0xffffffff")
    _warp_sums(k, acc, lane, warp, partial, rows)
    if norm:  # each warp's sum of x^2 into squares_partial[warp]
        squares_partial = k.op("mov.u32", k.shared("squares", "f32", MAX_WARPS, 16))
        for offset in (16, 8, 4, 2, 1):
            k.to(squares, "add.f32", squares, _shuffle(k, squares, offset))
        with k.if_(k.setp("eq.u32", lane, 0)):
            k.store("f32", k.op("mad.lo.u32", warp, 4, squares_partial), squares,
                    space="shared")
    k.emit("bar.sync 0")
    with k.if_(k.setp("lt.u32", tid, outputs)):  # thread r adds output r's warps
        # the block's rows of output r: r (a GLU's gate), r + outputs (its up)
        own = [tid, k.op("add.u32", tid, outputs)] if glu else [tid]
        totals = [k.op("mov.f32", f32(0.0)) for _ in own]
        total_squares = k.op("mov.f32", f32(0.0)) if norm else None
        warps = k.op("shr.u32", threads, 5)
        w = k.op("mov.u32", 0)
        with k.loop(w, warps, 1):
            for total, row in zip(totals, own):
                slot = k.op("mad.lo.u32", w, rows, row)
                k.to(total, "add.f32", total,
                     k.load("f32", k.op("mad.lo.u32", slot, 4, partial), space="shared"))
            if norm:
                k.to(total_squares, "add.f32", total_squares,
                     k.load("f32", k.op("mad.lo.u32", w, 4, squares_partial), space="shared"))
        if norm:  # 1 / rms(x), as the rmsnorm kernel computes it
            mean = k.op("div.rn.f32", total_squares, k.op("cvt.rn.f32.u32", K))
            scale = k.op("rsqrt.approx.f32", k.op("add.f32", mean, eps))
            totals = [k.op("mul.f32", total, scale) for total in totals]
        n = k.op("add.u32", first, tid)
        with k.if_(k.setp("lt.u32", n, N)):
            at = k.op("mad.lo.u32", m, N, n)
            value = totals[0]
            if glu:  # the glu kernel's math (elementwise.py)
                value = k.op("mul.f32", _unary_math(k, epilogue, value, value, value),
                             totals[1])
            elif residual is not None:
                value = k.op("add.f32", value, k.load("f32", k.element(residual, at, 4)))
            k.store("f32", k.element(y, at, 4), value)
    return k


def _group_rows(k: Kernel, g: int, group: int, outputs: int, first, count, N):
    """(first row of W, rows before N) of group g of a block whose outputs are first ..
    first + count - 1: a GLU's groups past its outputs are up rows, N further."""
    slot = g * group
    part = slot % outputs  # its first row's place among the gate's (or up's) rows
    held = k.op("min.u32", k.op("sub.u32", count, k.op("min.u32", count, part)), group)
    start = k.op("add.u32", first, part)
    if slot >= outputs:
        start = k.op("add.u32", start, N)
    return start, held


def _landed(barriers: str, slot_group: int) -> str:
    """The barrier that counts the copies into the slots of group `slot_group` (of the
    barriers at `barriers`: _stage_rows')."""
    return f"{barriers}+{8 * slot_group}"


def _copy_group(k: Kernel, src: SharedRows, g: int, slot_group: int, barriers: str, first,
                count, N, group: int, outputs: int, row_bytes) -> None:
    """Queue the copies of group g's rows into the slots of group `slot_group`, counted
    on that slot's barrier. The rows past N are not copied (their slots are not stored
    from)."""
    barrier = _landed(barriers, slot_group)
    start, held = _group_rows(k, g, group, outputs, first, count, N)
    k.barrier_expect(barrier, k.op("mul.lo.u32", held, row_bytes))
    with k.if_(k.setp("ne.u32", held, 0)):
        src.copy_rows(k, slot_group * group, start, held, barrier)


def _stage_rows(k: Kernel, src: SharedRows, tid, first, count, N, groups: int, group: int,
                outputs: int, queued: int):
    """Thread 0 initialises a barrier for each of the block's first `groups` groups of
    rows and queues the bulk copies of the first `queued` of them into their slots
    (matvec queues the others after its wait); returns the barriers' address (`_landed`
    gives a group's) and the bytes of a row."""
    barriers = k.op("mov.u32", k.shared("landed", "b64", groups, 8))
    row_bytes = k.op("mov.u32", 0)
    for plane_bytes in src.row_bytes.values():
        k.to(row_bytes, "add.u32", row_bytes, plane_bytes)
    with k.if_(k.setp("eq.u32", tid, 0)):
        k.barrier_init([_landed(barriers, g) for g in range(groups)])
        for g in range(queued):
            _copy_group(k, src, g, g, barriers, first, count, N, group, outputs, row_bytes)
    k.emit("bar.sync 0")  # the barriers exist before any thread waits on them
    return str(barriers), row_bytes


def matvec_group(rows: int, group: int, prefetch: str, epilogue: str) -> int:
    """The rows a group of a `matvec` of that shape: `group`, but a staged GLU's groups
    are gate rows or up rows, half the block's at most."""
    if prefetch in STAGING and epilogue in GLU_ACTIVATIONS:
        return min(group, rows // 2)
    return group


def matvec_args(qtype: str, rows: int, group: int, prefetch: str, norm: bool = False,
                epilogue: str = "none") -> tuple:
    """`matvec`'s arguments, as `variants` lists them (the plain product without the
    fusion's)."""
    fusion = () if (norm, epilogue) == FUSIONS[0] else (norm, epilogue)
    return (qtype, rows, group, prefetch, *fusion)


def float_value(k: Kernel, qtype: str, address) -> object:
    """The float32 value of one F32, F16 or BF16 element at `address`."""
    if qtype == "F32":
        return k.load("f32", address, "global.nc")
    half = k.load("b16", address, "global.nc")
    if qtype == "F16":
        return k.op("cvt.f32.f16", half)
    bits = k.op("shl.b32", k.op("cvt.u32.u16", half), 16)  # BF16: a float32's high half
    value = k.reg("f32")
    k.emit(f"mov.b32 {value}, {bits}")
    return value


def matvec_float_scalar(qtype: str) -> Kernel:
    """Grid (ceil(N / WARPS), M), THREADS threads: warp w of block (b, m) computes output
    b * WARPS + w of x row m."""
    fmt = FORMATS[qtype]
    size = FLOAT_BYTES[qtype]
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
            value = float_value(k, qtype, k.element(row, i, size))
            k.to(acc, "fma.rn.f32", value, k.load("f32", k.element(x_row, i, 4)), acc)
        for offset in (16, 8, 4, 2, 1):
            k.to(acc, "add.f32", acc, _shuffle(k, acc, offset))
        with k.if_(k.setp("eq.u32", lane, 0)):
            k.store("f32", k.element(y, k.op("mad.lo.u32", m, N, n), 4), acc)
    return k


def repack(qtype: str) -> Kernel:
    """GGUF rows into one plane a field (quant_blocks.Planes): block i's field f at
    plane_f + i * size_f. A thread a block, grid-stride; parameters w, the planes,
    blocks (N * blocks a row)."""
    fmt = FORMATS[qtype]
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
    for qtype, fmt in FORMATS.items():
        for prefetch in PREFETCHES:
            # every type's small-weight shape (ops.quantized.SMALL_SHAPE) too
            shapes = SHAPES if qtype in SWEPT and prefetch != "lines" else (
                (DEFAULT_SHAPE, (4, 4)) if prefetch != "lines" else (DEFAULT_SHAPE,))
            if prefetch in STAGING and STAGED_SHAPE not in shapes:
                shapes += (STAGED_SHAPE,)
            if prefetch == "ring":
                shapes = tuple(s for s in shapes + (RING_SHAPE,) if ring_takes(*s, prefetch))
            seen = set()
            for rows, group in shapes:
                for norm, epilogue in FUSIONS:
                    args = matvec_args(qtype, rows, matvec_group(rows, group, prefetch, epilogue),
                                       prefetch, norm, epilogue)
                    if args not in seen:
                        seen.add(args)
                        yield matvec, args
        if fmt.planes:
            yield repack, (qtype,)
        if fmt.is_float:
            yield matvec_float_scalar, (qtype,)
