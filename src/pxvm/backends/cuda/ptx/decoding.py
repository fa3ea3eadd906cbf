"""Decoding's step in PTX (pxvm.ops.decoding on CUDA): the flat argmax of the logits,
written into a decoding state [token, position, history...] on the device, so that
captured steps chain without the host. Two launches: `argmax_chunks`, a block per CHUNK
logits, leaves each chunk's best (value, index); `argmax_finish`, one block, takes the
best of those, writes the state and advances it.

The argmax is numpy's: a NaN beats every number, then the larger value, then the smaller
index (the first maximum, or the first NaN). With SAMPLE, logit i becomes logit /
temperature + Gumbel noise from hash(seed, counter, i) (decoding.gumbel_noise's, bit for
bit in its integer part: PCG's output hash), whose argmax is a draw from softmax(logits
/ temperature); the sampler [temperature, seed, counter] is read on the device and its
counter advanced. Temperature 0 is the plain argmax.
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32
from .rows import THREADS, WARPS

#: Logits a block of the first pass takes (as reduce.wgsl's ARGMAX_CHUNK).
CHUNK = 4096
NO_INDEX = 0xFFFFFFFF  # a thread without an element: loses to every element
LN2_HI = 0.693145751953125     # ln 2 in two parts: e * LN2_HI is exact for |e| < 2^11
LN2_LO = 1.428606765330187e-06
SQRT2 = 1.4142135623730951


def _better(k: Kernel, v: Reg, i: Reg, best_v: Reg, best_i: Reg) -> Reg:
    """Whether (v, i) comes before (best_v, best_i): NaN first, then larger, then the
    smaller index."""
    nan = k.setp("nan.f32", v, v)
    best_nan = k.setp("nan.f32", best_v, best_v)
    numbers = k.op("and.pred", k.op("not.pred", nan), k.op("not.pred", best_nan))
    first_nan = k.op("and.pred", nan, k.op("not.pred", best_nan))
    larger = k.op("and.pred", numbers, k.setp("gt.f32", v, best_v))
    same = k.op("or.pred", k.op("and.pred", nan, best_nan),
                k.op("and.pred", numbers, k.setp("eq.f32", v, best_v)))
    earlier = k.op("and.pred", same, k.setp("lt.u32", i, best_i))
    return k.op("or.pred", first_nan, k.op("or.pred", larger, earlier))


def _take_if_better(k: Kernel, v: Reg, i: Reg, best_v: Reg, best_i: Reg) -> None:
    better = _better(k, v, i, best_v, best_i)
    k.to(best_v, "selp.f32", v, best_v, better)
    k.to(best_i, "selp.u32", i, best_i, better)


def _block_argmax(k: Kernel, best_v: Reg, best_i: Reg) -> None:
    """The block's best (value, index) into thread 0's best_v, best_i: shuffles within
    each warp, then thread 0 over the warps' (through shared memory)."""
    for offset in (16, 8, 4, 2, 1):
        v = k.op("shfl.sync.bfly.b32", best_v, offset, "0x1f", "0xffffffff")
        i = k.op("shfl.sync.bfly.b32", best_i, offset, "0x1f", "0xffffffff")
        _take_if_better(k, v, i, best_v, best_i)
    values = k.op("mov.u32", k.shared("warp_values", "f32", WARPS, 16))
    indices = k.op("mov.u32", k.shared("warp_indices", "u32", WARPS, 16))
    tid = k.special("%tid.x")
    warp = k.op("shr.u32", tid, 5)
    with k.if_(k.setp("eq.u32", k.op("and.b32", tid, 31), 0)):
        k.store("f32", k.op("mad.lo.u32", warp, 4, values), best_v, space="shared")
        k.store("u32", k.op("mad.lo.u32", warp, 4, indices), best_i, space="shared")
    k.emit("bar.sync 0")
    with k.if_(k.setp("eq.u32", tid, 0)):
        for w in range(1, WARPS):
            _take_if_better(k, k.load("f32", f"{values}+{4 * w}", space="shared"),
                            k.load("u32", f"{indices}+{4 * w}", space="shared"), best_v, best_i)


def _pcg_hash(k: Kernel, v: Reg) -> Reg:
    """PCG's output hash of a u32 (decoding._pcg_hash)."""
    state = k.op("mad.lo.u32", v, 747796405, 2891336453)
    shift = k.op("add.u32", k.op("shr.u32", state, 28), 4)
    word = k.op("mul.lo.u32", k.op("xor.b32", k.op("shr.u32", state, shift), state), 277803737)
    return k.op("xor.b32", k.op("shr.u32", word, 22), word)


def _log(k: Kernel, x: Reg) -> Reg:
    """ln x of a positive normal float, to a few ulps: x = 2^e f, f in [sqrt(1/2),
    sqrt(2)), ln f = 2 atanh(z), z = (f - 1) / (f + 1), by its series (|z| < 0.172).
    lg2.approx would not do: Gumbel noise takes the log of values near 1, where its
    absolute error is larger than the result."""
    bits = k.op("mov.b32", x)
    exponent = k.op("sub.s32", k.op("shr.u32", bits, 23), 127)
    f = k.reg("f32")
    k.to(f, "mov.b32", k.op("or.b32", k.op("and.b32", bits, 0x7FFFFF), 0x3F800000))
    big = k.setp("gt.f32", f, f32(SQRT2))
    f = k.op("selp.f32", k.op("mul.f32", f, f32(0.5)), f, big)
    e = k.op("cvt.rn.f32.s32", k.op("selp.s32", k.op("add.s32", exponent, 1), exponent, big))
    z = k.op("div.rn.f32", k.op("sub.f32", f, f32(1.0)), k.op("add.f32", f, f32(1.0)))
    z2 = k.op("mul.f32", z, z)
    series = k.op("mov.f32", f32(1 / 11))
    for c in (1 / 9, 1 / 7, 1 / 5, 1 / 3, 1.0):
        series = k.op("fma.rn.f32", series, z2, f32(c))
    log_f = k.op("mul.f32", k.op("add.f32", z, z), series)
    return k.op("fma.rn.f32", e, f32(LN2_HI), k.op("fma.rn.f32", e, f32(LN2_LO), log_f))


def _gumbel(k: Kernel, inner: Reg, index: Reg) -> Reg:
    """-ln(-ln u), u in (0, 1) from 24 bits of hash(index ^ inner): as gumbel_noise, u
    computed with the same float32 roundings."""
    h = _pcg_hash(k, k.op("xor.b32", index, inner))
    u = k.op("mul.f32", k.op("add.f32", k.op("cvt.rn.f32.u32", k.op("shr.u32", h, 8)), f32(0.5)),
             f32(1.0 / 16777216.0))
    return k.op("neg.f32", _log(k, k.op("neg.f32", _log(k, u))))


def argmax_chunks(sample: bool) -> Kernel:
    """values[c], indices[c] = the best (value, flat index) of logits c * CHUNK .. (of
    n): grid.x = chunks, THREADS threads."""
    k = Kernel(f"argmax_chunks{'_sample' if sample else ''}",
               [("logits", "u64"), ("sampler", "u64"), ("values", "u64"), ("indices", "u64"),
                ("n", "u32")])
    logits, sampler, values, indices, n = k.params()
    chunk = k.special("%ctaid.x")
    first = k.op("mul.lo.u32", chunk, CHUNK)
    end = k.op("min.u32", k.op("add.u32", first, CHUNK), n)
    if sample:
        temperature = k.load("f32", sampler)
        seed = k.op("cvt.rzi.u32.f32", k.load("f32", f"{sampler}+4"))
        counter = k.op("cvt.rzi.u32.f32", k.load("f32", f"{sampler}+8"))
        inner = _pcg_hash(k, k.op("xor.b32", counter, _pcg_hash(k, seed)))
        drawing = k.setp("gt.f32", temperature, f32(0.0))
    best_v = k.op("mov.f32", f32(float("-inf")))
    best_i = k.op("mov.u32", NO_INDEX)
    i = k.op("add.u32", first, k.special("%tid.x"))
    with k.loop(i, end, THREADS):
        v = k.load("f32", k.element(logits, i, 4))
        if sample:
            drawn = k.op("add.f32", k.op("div.rn.f32", v, temperature), _gumbel(k, inner, i))
            v = k.op("selp.f32", drawn, v, drawing)
        _take_if_better(k, v, i, best_v, best_i)
    _block_argmax(k, best_v, best_i)
    with k.if_(k.setp("eq.u32", k.special("%tid.x"), 0)):
        k.store("f32", k.element(values, chunk, 4), best_v)
        k.store("u32", k.element(indices, chunk, 4), best_i)
    return k


def argmax_finish(sample: bool) -> Kernel:
    """The best of the chunks' (value, index) as the state's token: state = [token,
    position + 1, history...], the token also in history[position % history] (history:
    the state's length - 2); with SAMPLE the sampler's counter advances. One block."""
    k = Kernel(f"argmax_finish{'_sample' if sample else ''}",
               [("values", "u64"), ("indices", "u64"), ("state", "u64"), ("sampler", "u64"),
                ("chunks", "u32"), ("history", "u32")])
    values, indices, state, sampler, chunks, history = k.params()
    best_v = k.op("mov.f32", f32(float("-inf")))
    best_i = k.op("mov.u32", NO_INDEX)
    c = k.special("%tid.x")
    with k.loop(c, chunks, THREADS):
        _take_if_better(k, k.load("f32", k.element(values, c, 4)),
                        k.load("u32", k.element(indices, c, 4)), best_v, best_i)
    _block_argmax(k, best_v, best_i)
    with k.if_(k.setp("eq.u32", k.special("%tid.x"), 0)):
        k.store("u32", state, best_i)
        position = k.load("u32", f"{state}+4")
        with k.if_(k.setp("ne.u32", history, 0)):
            slot = k.op("add.u32", k.op("rem.u32", position, history), 2)
            k.store("u32", k.element(state, slot, 4), best_i)
        k.store("u32", f"{state}+4", k.op("add.u32", position, 1))
        if sample:
            k.store("f32", f"{sampler}+8",
                    k.op("add.f32", k.load("f32", f"{sampler}+8"), f32(1.0)))
    return k


def argmax_rows() -> Kernel:
    """out[r] = the index of row r's best logit (rows of n, one after another; numpy's
    argmax along the last axis): grid.x = rows, THREADS threads. A batch's next tokens
    read back as a few integers instead of its rows of logits."""
    k = Kernel("argmax_rows", [("x", "u64"), ("out", "u64"), ("n", "u32")])
    x, out, n = k.params()
    row = k.special("%ctaid.x")
    base = k.op("add.u64", x, k.op("mul.wide.u32", k.op("mul.lo.u32", row, n), 4))
    best_v = k.op("mov.f32", f32(float("-inf")))
    best_i = k.op("mov.u32", NO_INDEX)
    i = k.op("mov.u32", k.special("%tid.x"))
    with k.loop(i, n, THREADS):
        _take_if_better(k, k.load("f32", k.element(base, i, 4)), i, best_v, best_i)
    _block_argmax(k, best_v, best_i)
    with k.if_(k.setp("eq.u32", k.special("%tid.x"), 0)):
        k.store("u32", k.element(out, row, 4), best_i)
    return k


def advance_tokens() -> Kernel:
    """token_ids[i] = tokens[i], token_table[i, 1] += 1 for i < n (ops.decoding's
    advance_tokens): a thread a token."""
    k = Kernel("advance_tokens", [("ids", "u64"), ("table", "u64"), ("tokens", "u64"),
                                  ("n", "u32")])
    ids, table, tokens, n = k.params()
    i = k.global_index()
    with k.if_(k.setp("lt.u32", i, n)):
        k.store("u32", k.element(ids, i, 4), k.load("u32", k.element(tokens, i, 4)))
        position = k.op("add.u64", k.element(table, i, 8), 4)
        k.store("u32", position, k.op("add.u32", k.load("u32", position), 1))
    return k


def variants():
    for sample in (False, True):
        yield argmax_chunks, (sample,)
        yield argmax_finish, (sample,)
    yield argmax_rows, ()
    yield advance_tokens, ()


__all__ = ["CHUNK", "THREADS", "advance_tokens", "argmax_chunks", "argmax_finish",
           "argmax_rows", "variants"]
