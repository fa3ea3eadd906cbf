"""Row-wise kernels in PTX over the last axis: rmsnorm, layer norm, softmax and
log-softmax, one block of THREADS threads per row (grid.x = rows), reading the row in
groups of VEC values (4: 16-byte loads, where the row length allows; 1 otherwise). A
row's sums and maxima are reduced within each warp by butterfly shuffles, then across
the warps through shared memory. And `rope`, the rotary embedding of rows of heads, a
thread a pair; `qk_norm`, rmsnorm of the query and key heads of projected qkv rows, a
warp a head."""

from __future__ import annotations

from .builder import Kernel, Reg, f32
from .elementwise import VECS, _exp, _load, _store, _store_half

THREADS = 256
WARPS = THREADS // 32
#: Rows up to this many bytes are kept in shared memory between rmsnorm's passes (the
#: default dynamic shared memory a block may take without opting in to more).
MAX_CACHED_ROW_BYTES = 48 * 1024
LN2 = 0.6931471805599453


def _block_reduce(k: Kernel, value: Reg, instr: str, scratch: str) -> Reg:
    """`instr` (add.f32, max.NaN.f32) of `value` over the block, in every thread."""
    for offset in (16, 8, 4, 2, 1):
        other = k.op("shfl.sync.bfly.b32", value, offset, "0x1f", "0xffffffff")
        value = k.op(instr, value, other)
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    warp = k.op("shr.u32", tid, 5)
    slot = k.op("add.u32", k.op("mov.u32", scratch), k.op("mul.lo.u32", warp, 4))
    with k.if_(k.setp("eq.u32", lane, 0)):
        k.store("f32", slot, value, space="shared")
    k.emit("bar.sync 0")
    base = k.op("mov.u32", scratch)
    total = k.load("f32", base, space="shared")
    for w in range(1, WARPS):
        total = k.op(instr, total, k.load("f32", f"{base}+{4 * w}", space="shared"))
    k.emit("bar.sync 0")  # the scratch is written again by the next reduction
    return total


def _row(k: Kernel, row_groups: Reg) -> tuple[Reg, Reg]:
    """(this block's row's first group index, this thread's first group in the row)."""
    first = k.op("mul.lo.u32", k.special("%ctaid.x"), row_groups)
    return first, k.special("%tid.x")


def _groups(k: Kernel, column: Reg, row_groups: Reg):
    """A loop over this thread's groups of the row: column, column + THREADS, .. (the
    counter is a copy, so `column` can start another loop)."""
    c = k.op("mov.u32", column)
    return c, k.loop(c, row_groups, THREADS)


def rmsnorm(vec: int = 4, cached: bool = False, half: bool = False) -> Kernel:
    """y = x / sqrt(mean(x^2) + eps) * w, per row of row_groups groups of `vec` values.
    `cached` keeps the row in dynamic shared memory (row_groups * vec * 4 bytes a block)
    between its two passes, so that x is read from memory once. `half`: y in float16
    (what a prompt's tensor-core product reads)."""
    k = Kernel(f"rmsnorm_v{vec}{'_cached' if cached else ''}{'_f16' if half else ''}",
               [("x", "u64"), ("w", "u64"), ("y", "u64"), ("row_groups", "u32"),
                ("eps", "f32")])
    x, w, y, row_groups, eps = k.params()
    scratch = k.shared("partial", "f32", WARPS, 16)
    row_cache = k.op("mov.u32", k.shared("row_cache", "f32", None, 16)) if cached else None

    def cache_slot(c):
        return k.op("mad.lo.u32", c, 4 * vec, row_cache)

    first, column = _row(k, row_groups)
    squares = k.op("mov.f32", f32(0.0))
    c, loop = _groups(k, column, row_groups)
    with loop:
        values = _load(k, x, k.op("add.u32", first, c), vec)
        if cached:
            _store_shared(k, cache_slot(c), values)
        for v in values:
            k.to(squares, "fma.rn.f32", v, v, squares)
    total = _block_reduce(k, squares, "add.f32", scratch)
    count = k.op("cvt.rn.f32.u32", k.op("mul.lo.u32", row_groups, vec))
    scale = k.op("rsqrt.approx.f32", k.op("add.f32", k.op("div.rn.f32", total, count), eps))
    c, loop = _groups(k, column, row_groups)
    with loop:
        i = k.op("add.u32", first, c)
        row = _load_shared(k, cache_slot(c), vec) if cached else _load(k, x, i, vec)
        values = zip(row, _load(k, w, c, vec))
        (_store_half if half else _store)(
            k, y, i, [k.op("mul.f32", k.op("mul.f32", v, scale), g) for v, g in values])
    return k


def _store_shared(k: Kernel, address: Reg, values: list[Reg]) -> None:
    if len(values) > 1:
        k.store_vector("f32", address, values, space="shared")
    else:
        k.store("f32", address, values[0], space="shared")


def _load_shared(k: Kernel, address: Reg, vec: int) -> list[Reg]:
    if vec > 1:
        return k.load_vector("f32", address, vec, space="shared")
    return [k.load("f32", address, space="shared")]


def softmax(log: bool = False, vec: int = 4) -> Kernel:
    """y = exp(x - max) / sum(exp(x - max)) per row, or its log (x - max - ln sum)."""
    k = Kernel(f"{'log_softmax' if log else 'softmax'}_v{vec}",
               [("x", "u64"), ("y", "u64"), ("row_groups", "u32")])
    x, y, row_groups = k.params()
    scratch = k.shared("partial", "f32", WARPS, 16)
    first, column = _row(k, row_groups)
    top = k.op("mov.f32", f32(float("-inf")))
    c, loop = _groups(k, column, row_groups)
    with loop:
        for v in _load(k, x, k.op("add.u32", first, c), vec):
            k.to(top, "max.NaN.f32", top, v)
    top = _block_reduce(k, top, "max.NaN.f32", scratch)
    total = k.op("mov.f32", f32(0.0))
    c, loop = _groups(k, column, row_groups)
    with loop:
        for v in _load(k, x, k.op("add.u32", first, c), vec):
            k.to(total, "add.f32", total, _exp(k, k.op("sub.f32", v, top)))
    total = _block_reduce(k, total, "add.f32", scratch)
    log_total = k.op("mul.f32", k.op("lg2.approx.f32", total), f32(LN2)) if log else None
    c, loop = _groups(k, column, row_groups)
    with loop:
        i = k.op("add.u32", first, c)
        out = []
        for v in _load(k, x, i, vec):
            shifted = k.op("sub.f32", v, top)
            out.append(k.op("sub.f32", shifted, log_total) if log
                       else k.op("div.rn.f32", _exp(k, shifted), total))
        _store(k, y, i, out)
    return k


def layer_norm(vec: int = 4) -> Kernel:
    """y = (x - mean) / sqrt(var + eps) * w + b per row, the variance from a second pass
    over (x - mean)^2 (no cancellation)."""
    k = Kernel(f"layer_norm_v{vec}", [("x", "u64"), ("w", "u64"), ("b", "u64"), ("y", "u64"),
                                      ("row_groups", "u32"), ("eps", "f32")])
    x, w, bias, y, row_groups, eps = k.params()
    scratch = k.shared("partial", "f32", WARPS, 16)
    first, column = _row(k, row_groups)
    count = k.op("cvt.rn.f32.u32", k.op("mul.lo.u32", row_groups, vec))
    total = k.op("mov.f32", f32(0.0))
    c, loop = _groups(k, column, row_groups)
    with loop:
        for v in _load(k, x, k.op("add.u32", first, c), vec):
            k.to(total, "add.f32", total, v)
    mean = k.op("div.rn.f32", _block_reduce(k, total, "add.f32", scratch), count)
    squares = k.op("mov.f32", f32(0.0))
    c, loop = _groups(k, column, row_groups)
    with loop:
        for v in _load(k, x, k.op("add.u32", first, c), vec):
            d = k.op("sub.f32", v, mean)
            k.to(squares, "fma.rn.f32", d, d, squares)
    var = k.op("div.rn.f32", _block_reduce(k, squares, "add.f32", scratch), count)
    scale = k.op("rsqrt.approx.f32", k.op("add.f32", var, eps))
    c, loop = _groups(k, column, row_groups)
    with loop:
        i = k.op("add.u32", first, c)
        out = [k.op("fma.rn.f32", k.op("mul.f32", k.op("sub.f32", v, mean), scale), g, b)
               for v, g, b in zip(_load(k, x, i, vec), _load(k, w, c, vec),
                                  _load(k, bias, c, vec))]
        _store(k, y, i, out)
    return k


def variants():
    yield rope, (False,)
    yield rope, (True,)
    yield qk_norm, ()
    for vec in VECS:
        yield layer_norm, (vec,)
        for cached in (False, True):
            for half in (False, True):
                yield rmsnorm, (vec, cached, half)
        yield softmax, (False, vec)
        yield softmax, (True, vec)


__all__ = ["THREADS", "layer_norm", "qk_norm", "rmsnorm", "rope", "softmax", "variants"]


def rope(neox: bool = False) -> Kernel:
    """Rotary embedding of x (seq, heads, 2 half): pair i of row (s, h) turned by the
    table's (cos, sin) at position pos_offset + s (table (positions, half, 2), computed
    on the host); `neox` pairs (i, i + half), else (2i, 2i + 1). A thread a pair,
    grid-stride."""
    k = Kernel(f"rope_{'neox' if neox else 'interleaved'}",
               [("x", "u64"), ("table", "u64"), ("y", "u64"), ("pairs", "u32"),
                ("heads", "u32"), ("half", "u32"), ("pos_offset", "u32")])
    x, table, y, pairs, heads, half, pos_offset = k.params()
    t, stride = k.grid_stride()
    with k.loop(t, pairs, stride):
        i = k.op("rem.u32", t, half)
        row = k.op("div.u32", t, half)
        pos = k.op("add.u32", pos_offset, k.op("div.u32", row, heads))
        entry = k.element(table, k.op("mad.lo.u32", pos, half, i), 8)
        cos, sin = k.load("f32", entry), k.load("f32", f"{entry}+4")
        base = k.op("mul.lo.u32", k.op("shl.b32", row, 1), half)  # row * head_dim
        if neox:
            j0 = k.op("add.u32", base, i)
            j1 = k.op("add.u32", j0, half)
        else:
            j0 = k.op("add.u32", base, k.op("shl.b32", i, 1))
            j1 = k.op("add.u32", j0, 1)
        a, b = k.load("f32", k.element(x, j0, 4)), k.load("f32", k.element(x, j1, 4))
        k.store("f32", k.element(y, j0, 4),
                k.op("sub.f32", k.op("mul.f32", a, cos), k.op("mul.f32", b, sin)))
        k.store("f32", k.element(y, j1, 4),
                k.op("fma.rn.f32", a, sin, k.op("mul.f32", b, cos)))
    return k


def qk_norm() -> Kernel:
    """qkv rows of Hq query, Hkv key and Hkv value heads of D values: out = each query
    head rmsnorm'ed by q_gain, each key head by k_gain, value heads copied. A warp a head
    (heads = rows * (Hq + 2 Hkv) of them, WARPS a block), its lanes taking elements
    lane, lane + 32, .. and summing their squares by shuffles."""
    k = Kernel("qk_norm", [("qkv", "u64"), ("q_gain", "u64"), ("k_gain", "u64"), ("out", "u64"),
                           ("heads", "u32"), ("hq", "u32"), ("hkv", "u32"),
                           ("head_dim", "u32"), ("eps", "f32")])
    qkv, q_gain, k_gain, out, heads, hq, hkv, d, eps = k.params()
    tid = k.special("%tid.x")
    lane = k.op("and.b32", tid, 31)
    head = k.op("mad.lo.u32", k.special("%ctaid.x"), WARPS, k.op("shr.u32", tid, 5))
    with k.if_(k.setp("lt.u32", head, heads)):  # the same for the whole warp
        kind = k.op("rem.u32", head, k.op("add.u32", hq, k.op("shl.b32", hkv, 1)))
        is_query = k.setp("lt.u32", kind, hq)
        is_value = k.setp("ge.u32", kind, k.op("add.u32", hq, hkv))
        gain = k.op("selp.b64", q_gain, k_gain, is_query)
        first = k.op("mul.lo.u32", head, d)
        squares = k.op("mov.f32", f32(0.0))
        c = k.op("mov.u32", lane)
        with k.loop(c, d, 32):
            v = k.load("f32", k.element(qkv, k.op("add.u32", first, c), 4))
            k.to(squares, "fma.rn.f32", v, v, squares)
        for offset in (16, 8, 4, 2, 1):
            k.to(squares, "add.f32", squares,
                 k.op("shfl.sync.bfly.b32", squares, offset, "0x1f", "0xffffffff"))
        mean = k.op("div.rn.f32", squares, k.op("cvt.rn.f32.u32", d))
        scale = k.op("rsqrt.approx.f32", k.op("add.f32", mean, eps))
        c = k.op("mov.u32", lane)
        with k.loop(c, d, 32):
            i = k.op("add.u32", first, c)
            v = k.load("f32", k.element(qkv, i, 4))
            g = k.load("f32", k.element(gain, c, 4))
            normed = k.op("mul.f32", k.op("mul.f32", v, scale), g)
            k.store("f32", k.element(out, i, 4), k.op("selp.f32", v, normed, is_value))
    return k
