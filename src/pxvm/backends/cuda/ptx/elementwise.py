"""Element-wise kernels in PTX: the activations, scale and clip (`unary`), and add, sub,
mul, div, maximum, minimum (`binary`) on float32, each a grid-stride loop over groups of
VEC elements (4: one 16-byte load per operand; 1 where counts are not multiples of 4).

`binary` takes its operands at the same size, or one of them repeated over the other's
leading dimensions (a row of biases added to every row: BROADCAST "b", or "a").
`glu` is a gated feed-forward's act(gate) * up. `copy` is the bandwidth yardstick of
the benchmarks; `copy_rows` copies a block of a matrix into a window of another (slicing
rows or columns, joining columns, writing rows in place).

Transcendentals use ex2.approx (relative error ~2^-22) in forms that stay finite where
the references' do: sigmoid 1/(1+e^-x), tanh by e^-2|x|, GELU's tanh form as x
sigmoid(2u); divisions are IEEE (div.rn).
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32

UNARY = ("relu", "leaky_relu", "elu", "sigmoid", "tanh", "silu", "gelu_tanh", "clip", "scale")
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")
BROADCASTS = ("none", "a", "b")
#: the gate activations of `glu`: SwiGLU's and GeGLU's
GLU = ("silu", "gelu_tanh")
VECS = (1, 4)
THREADS = 256
LOG2E = 1.4426950408889634
#: below it, tanh and e^x - 1 come from their series (relative error under 1e-9 there)
SMALL = 0.0625


def _exp(k: Kernel, x: Reg) -> Reg:
    """e^x (ex2 of x log2 e)."""
    return k.op("ex2.approx.ftz.f32", k.op("mul.f32", x, f32(LOG2E)))


def _small(k: Kernel, x: Reg) -> Reg:
    """|x| < SMALL: where e^x - 1 and 1 - e^-x lose their digits to cancellation (series
    take over)."""
    return k.setp("lt.f32", k.op("abs.f32", x), f32(SMALL))


def _series(k: Kernel, x: Reg, coefficients) -> Reg:
    """c0 + c1 x + c2 x^2 + .. by Horner's rule."""
    acc = k.op("mov.f32", f32(coefficients[-1]))
    for c in reversed(coefficients[:-1]):
        acc = k.op("fma.rn.f32", acc, x, f32(c))
    return acc


def _expm1(k: Kernel, x: Reg) -> Reg:
    """e^x - 1, by its series near 0."""
    near = k.op("mul.f32", x, _series(k, x, (1.0, 1 / 2, 1 / 6, 1 / 24, 1 / 120)))
    return k.op("selp.f32", near, k.op("sub.f32", _exp(k, x), f32(1.0)), _small(k, x))


def _unary_math(k: Kernel, op: str, x: Reg, alpha: Reg, beta: Reg) -> Reg:
    """`op` of one element x (alpha, beta: leaky_relu's slope, elu's alpha, clip's bounds,
    scale's factor)."""
    negative = lambda: k.setp("lt.f32", x, f32(0.0))  # noqa: E731 - false for NaN
    if op == "relu":
        return k.op("selp.f32", f32(0.0), x, negative())
    if op == "leaky_relu":
        return k.op("selp.f32", k.op("mul.f32", x, alpha), x, negative())
    if op == "elu":
        below = k.op("mul.f32", alpha, _expm1(k, x))
        return k.op("selp.f32", below, x, negative())
    if op == "scale":
        return k.op("mul.f32", x, alpha)
    if op == "clip":
        return k.op("min.NaN.f32", k.op("max.NaN.f32", x, alpha), beta)
    if op in ("sigmoid", "silu", "gelu_tanh"):
        u = x
        if op == "gelu_tanh":  # x sigmoid(2u), u = sqrt(2/pi) (x + 0.044715 x^3)
            cube = k.op("mul.f32", k.op("mul.f32", x, x), x)
            inner = k.op("fma.rn.f32", cube, f32(0.044715), x)
            u = k.op("mul.f32", inner, f32(2 * 0.7978845608028654))
        e = _exp(k, k.op("neg.f32", u))
        denominator = k.op("add.f32", e, f32(1.0))
        return k.op("div.rn.f32", f32(1.0) if op == "sigmoid" else x, denominator)
    if op == "tanh":  # sign(x) (1 - e^-2|x|) / (1 + e^-2|x|); a series near 0
        t = _exp(k, k.op("mul.f32", k.op("abs.f32", x), f32(-2.0)))
        r = k.op("div.rn.f32", k.op("sub.f32", f32(1.0), t), k.op("add.f32", f32(1.0), t))
        far = k.op("copysign.f32", x, r)
        near = k.op("mul.f32", x, _series(k, k.op("mul.f32", x, x),
                                          (1.0, -1 / 3, 2 / 15, -17 / 315)))
        return k.op("selp.f32", near, far, _small(k, x))
    raise ValueError(f"no PTX for unary op {op!r}")


def _binary_math(k: Kernel, op: str, a: Reg, b: Reg) -> Reg:
    instr = {"add": "add.f32", "sub": "sub.f32", "mul": "mul.f32", "div": "div.rn.f32",
             "maximum": "max.NaN.f32", "minimum": "min.NaN.f32"}[op]
    return k.op(instr, a, b)


def _load(k: Kernel, base: Reg, group: Reg, vec: int) -> list[Reg]:
    address = k.element(base, group, 4 * vec)
    return k.load_vector("f32", address, vec) if vec > 1 else [k.load("f32", address)]


def _store(k: Kernel, base: Reg, group: Reg, values: list[Reg]) -> None:
    address = k.element(base, group, 4 * len(values))
    if len(values) > 1:
        k.store_vector("f32", address, values)
    else:
        k.store("f32", address, values[0])


def _store_half(k: Kernel, base: Reg, group: Reg, values: list[Reg]) -> None:
    """`values` rounded to float16 at group `group` of len(values) float16 values."""
    halves = [k.op("cvt.rn.f16.f32", v) for v in values]
    if len(halves) == 1:
        k.store("b16", k.element(base, group, 2), halves[0])
        return
    words = []
    for low, high in zip(halves[::2], halves[1::2]):
        word = k.reg("b32")
        k.emit(f"mov.b32 {word}, {{{low}, {high}}}")
        words.append(word)
    address = k.element(base, group, 2 * len(values))
    if len(words) == 1:
        k.store("b32", address, words[0])
    else:
        k.store_vector("b32", address, words)


def unary(op: str, vec: int = 4) -> Kernel:
    """y[i] = op(x[i]) for n_groups groups of `vec` elements."""
    k = Kernel(f"unary_{op}_v{vec}", [("x", "u64"), ("y", "u64"), ("n_groups", "u32"),
                                      ("alpha", "f32"), ("beta", "f32")])
    x, y, n_groups, alpha, beta = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, n_groups, stride):
        values = _load(k, x, i, vec)
        _store(k, y, i, [_unary_math(k, op, v, alpha, beta) for v in values])
    return k


def binary(op: str, broadcast: str = "none", vec: int = 4) -> Kernel:
    """out[i] = a[i] op b[i]; with BROADCAST "b", b holds `m_groups` groups repeated over
    a's (b[i % m_groups]), with "a" the other way round."""
    k = Kernel(f"binary_{op}_{broadcast}_v{vec}",
               [("a", "u64"), ("b", "u64"), ("out", "u64"), ("n_groups", "u32"),
                ("m_groups", "u32")])
    a, b, out, n_groups, m_groups = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, n_groups, stride):
        j = i if broadcast == "none" else k.op("rem.u32", i, m_groups)
        av = _load(k, a, j if broadcast == "a" else i, vec)
        bv = _load(k, b, j if broadcast == "b" else i, vec)
        _store(k, out, i, [_binary_math(k, op, p, q) for p, q in zip(av, bv)])
    return k


def copy(vec: int = 4) -> Kernel:
    """y = x, n_groups groups of `vec` floats (the benchmarks' bandwidth yardstick)."""
    k = Kernel(f"copy_v{vec}", [("x", "u64"), ("y", "u64"), ("n_groups", "u32")])
    x, y, n_groups = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, n_groups, stride):
        _store(k, y, i, _load(k, x, i, vec))
    return k


def glu(act: str, vec: int = 4) -> Kernel:
    """out (M, F) = act(both[:, :F]) * both[:, F:] for both (M, 2F): the gate's columns,
    then the up projection's; n_groups = M F / vec, f_groups = F / vec."""
    k = Kernel(f"glu_{act}_v{vec}", [("both", "u64"), ("out", "u64"), ("n_groups", "u32"),
                                     ("f_groups", "u32")])
    both, out, n_groups, f_groups = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, n_groups, stride):
        row = k.op("div.u32", i, f_groups)
        gate = k.op("add.u32", i, k.op("mul.lo.u32", row, f_groups))  # row 2F + column
        up = k.op("add.u32", gate, f_groups)
        values = zip(_load(k, both, gate, vec), _load(k, both, up, vec))
        _store(k, out, i, [k.op("mul.f32", _unary_math(k, act, g, g, g), u) for g, u in values])
    return k


def copy_rows(vec: int = 4) -> Kernel:
    """dst[dst_row0 + r, dst_col0 + c] = src[src_row0 + r, src_col0 + c] for n_groups /
    row_groups rows of row_groups groups of `vec` floats; src rows are src_row_groups
    groups long, dst rows dst_row_groups (every count in groups)."""
    k = Kernel(f"copy_rows_v{vec}",
               [("src", "u64"), ("dst", "u64"), ("n_groups", "u32"), ("row_groups", "u32"),
                ("src_row0", "u32"), ("dst_row0", "u32"), ("dst_row_groups", "u32"),
                ("dst_col0", "u32"), ("src_row_groups", "u32"), ("src_col0", "u32")])
    (src, dst, n_groups, row_groups, src_row0, dst_row0, dst_row_groups, dst_col0,
     src_row_groups, src_col0) = k.params()
    i, stride = k.grid_stride()
    with k.loop(i, n_groups, stride):
        r = k.op("div.u32", i, row_groups)
        c = k.op("rem.u32", i, row_groups)
        source = k.op("mad.lo.u32", k.op("add.u32", src_row0, r), src_row_groups,
                      k.op("add.u32", src_col0, c))
        target = k.op("mad.lo.u32", k.op("add.u32", dst_row0, r), dst_row_groups,
                      k.op("add.u32", dst_col0, c))
        _store(k, dst, target, _load(k, src, source, vec))
    return k


def variants():
    """(kernel builder, its arguments) of every kernel this family emits."""
    for vec in VECS:
        for act in GLU:
            yield glu, (act, vec)
        yield copy_rows, (vec,)
        for op in UNARY:
            yield unary, (op, vec)
        for op in BINARY:
            for broadcast in BROADCASTS:
                yield binary, (op, broadcast, vec)
        yield copy, (vec,)
