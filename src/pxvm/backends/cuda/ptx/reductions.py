"""Whole-tensor reductions in PTX: sum, max and dot of float32 values, in two launches:
`partials` reduces a grid-stride share of the elements per block (warp shuffles, then
across warps in shared memory) into one value a block, `finish` reduces those in one
block. Sums accumulate in float32 (the references in float64)."""

from __future__ import annotations

from .builder import Kernel, f32
from .rows import THREADS, WARPS, _block_reduce

OPS = ("sum", "max", "dot")
#: blocks of the first launch (the second reduces this many partial values)
PARTIALS = 512


def _combine(op: str) -> str:
    return "max.NaN.f32" if op == "max" else "add.f32"


def partials(op: str) -> Kernel:
    """partial[block] = op over elements block * THREADS + tid, + grid stride .. < n
    (dot: of a[i] * b[i])."""
    k = Kernel(f"reduce_{op}_partials", [("a", "u64"), ("b", "u64"), ("partial", "u64"),
                                          ("n", "u32")])
    a, b, partial, n = k.params()
    scratch = k.shared("scratch", "f32", WARPS, 16)
    acc = k.op("mov.f32", f32(float("-inf")) if op == "max" else f32(0.0))
    i, stride = k.grid_stride()
    with k.loop(i, n, stride):
        v = k.load("f32", k.element(a, i, 4))
        if op == "dot":
            k.to(acc, "fma.rn.f32", v, k.load("f32", k.element(b, i, 4)), acc)
        else:
            k.to(acc, _combine(op), acc, v)
    total = _block_reduce(k, acc, _combine(op), scratch)
    with k.if_(k.setp("eq.u32", k.special("%tid.x"), 0)):
        k.store("f32", k.element(partial, k.special("%ctaid.x"), 4), total)
    return k


def finish(op: str) -> Kernel:
    """out[0] = op over partial[0 .. count) (one block)."""
    k = Kernel(f"reduce_{op}_finish", [("partial", "u64"), ("out", "u64"), ("count", "u32")])
    partial, out, count = k.params()
    scratch = k.shared("scratch", "f32", WARPS, 16)
    acc = k.op("mov.f32", f32(float("-inf")) if op == "max" else f32(0.0))
    i = k.special("%tid.x")
    with k.loop(i, count, THREADS):
        k.to(acc, _combine(op), acc, k.load("f32", k.element(partial, i, 4)))
    total = _block_reduce(k, acc, _combine(op), scratch)
    with k.if_(k.setp("eq.u32", k.special("%tid.x"), 0)):
        k.store("f32", out, total)
    return k


def variants():
    for op in OPS:
        yield partials, (op,)
        yield finish, (op,)
