"""16-lane vectors for numba kernels, written as LLVM vector code (numba `@intrinsic`s).

numba's own loops widen integer arithmetic to 64 bits and do not find the multiply-adds
of int16 pairs that x86 has (pmaddwd; vpdpwssd with AVX512-VNNI: 32 multiply-adds an
instruction). These helpers give kernels vectors of 16 int32 or float32 lanes (one
AVX-512 register, two AVX2 ones) and the few operations quantized.py needs, in the
generic IR that LLVM turns into those instructions for whatever CPU it compiles for.

An int32 lane often holds a pair of int16 values (low half first): `dot_pairs` multiplies
two such pairs and adds both products into the lane. Loads and stores take an array and
a tuple of indices, of the first of 16 elements that lie next to each other in memory
(any layout; not bounds-checked).

numba's disk cache of a kernel does not notice changes to this file: after editing it,
delete the cached kernels (__pycache__/quantized*, __pycache__/integer*).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, models, register_model

LANES = 16

_I16 = ir.IntType(16)
_I32 = ir.IntType(32)
_INTS = ir.VectorType(_I32, LANES)
_FLOATS = ir.VectorType(ir.FloatType(), LANES)
_PAIRS = ir.VectorType(_I16, 2 * LANES)
_WIDE = ir.VectorType(_I32, 2 * LANES)


class _Ints(types.Type):
    """16 int32 lanes, kept in a vector register."""

    def __init__(self):
        super().__init__(name="int32x16")


class _Floats(types.Type):
    """16 float32 lanes, kept in a vector register."""

    def __init__(self):
        super().__init__(name="float32x16")


ints, floats = _Ints(), _Floats()


@register_model(_Ints)
class _IntsModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _INTS)


@register_model(_Floats)
class _FloatsModel(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _FLOATS)


def _address(context, builder, aryty, ary, indexty, index, pointee):
    """Pointer to ary[index] (a tuple of indices, no wraparound), as a `pointee`*."""
    indices = [context.cast(builder, v, t, types.intp)
               for v, t in zip(cgutils.unpack_tuple(builder, index, len(indexty)), indexty)]
    ptr = cgutils.get_item_pointer(context, builder, aryty, context.make_array(aryty)(
        context, builder, ary), indices, wraparound=False)
    return builder.bitcast(ptr, pointee.as_pointer())


def _int32(builder, value):
    """An integer argument (numba passes int64) as an i32."""
    return builder.trunc(value, _I32) if value.type.width > 32 else value


def _splat(builder, value, vector_type):
    """`value` in every lane."""
    one = builder.insert_element(ir.Constant(vector_type, None), value, ir.Constant(_I32, 0))
    mask = ir.Constant(ir.VectorType(_I32, vector_type.count), [0] * vector_type.count)
    return builder.shuffle_vector(one, one, mask)


@intrinsic
def prefetch(typingctx, array, index, offset):
    """Ask for the cache line `offset` bytes past array[index] ahead of its use
    (prefetcht0; never faults, wherever it points)."""
    def codegen(context, builder, sig, args):
        start = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1],
                         ir.IntType(8))
        address = builder.gep(start, [args[2]])
        ptr = ir.IntType(8).as_pointer()
        fetch = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(ir.VoidType(), [ptr, _I32, _I32, _I32]),
            "llvm.prefetch.p0i8")
        # a read (0), kept in every cache level (3), of data (1)
        builder.call(fetch, [address, ir.Constant(_I32, 0), ir.Constant(_I32, 3),
                             ir.Constant(_I32, 1)])
        return context.get_dummy_value()
    return types.none(array, index, offset), codegen


@intrinsic
def zeros(typingctx):
    """16 int32 lanes of 0."""
    def codegen(context, builder, sig, args):
        return ir.Constant(_INTS, None)
    return ints(), codegen


@intrinsic
def load_ints(typingctx, array, index):
    """array[index: 16 on], a 32-bit integer array, as int32 lanes."""
    def codegen(context, builder, sig, args):
        address = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1], _INTS)
        return builder.load(address, align=4)
    return ints(array, index), codegen


@intrinsic
def load_floats(typingctx, array, index):
    """array[index: 16 on] as float32 lanes: a float32 array, a uint16 one holding the
    bits of float16 values (converted by vcvtph2ps), or a uint8 one of integers."""
    if array.dtype not in (types.float32, types.uint16, types.uint8):
        return None

    def codegen(context, builder, sig, args):
        dtype = sig.args[0].dtype
        lanes = ir.VectorType(context.get_value_type(dtype), LANES)
        address = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1], lanes)
        loaded = builder.load(address, align=dtype.bitwidth // 8)
        if dtype == types.float32:
            return loaded
        if dtype == types.uint8:
            return builder.uitofp(loaded, _FLOATS)
        return builder.fpext(builder.bitcast(loaded, ir.VectorType(ir.HalfType(), LANES)),
                             _FLOATS)
    return floats(array, index), codegen


@intrinsic
def splat(typingctx, value):
    """`value` (a number) in every float32 lane."""
    def codegen(context, builder, sig, args):
        return _splat(builder, context.cast(builder, args[0], sig.args[0], types.float32),
                      _FLOATS)
    return floats(value), codegen


@intrinsic
def load_byte_pairs(typingctx, array, index):
    """array[index: 32 on], an 8-bit array, as 16 pairs of int16 (sign- or zero-extended
    as the array's dtype is), a pair a lane."""
    def codegen(context, builder, sig, args):
        raw = ir.VectorType(ir.IntType(8), 2 * LANES)
        address = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1], raw)
        widen = builder.sext if sig.args[0].dtype.signed else builder.zext
        return builder.bitcast(widen(builder.load(address, align=1), _PAIRS), _INTS)
    return ints(array, index), codegen


def _store_codegen(lanes):
    """Codegen of array[index: 16 on] = vector, for vectors of type `lanes`."""
    def codegen(context, builder, sig, args):
        address = _address(context, builder, sig.args[0], args[0], sig.args[1], args[1], lanes)
        builder.store(args[2], address, align=4)
        return context.get_dummy_value()
    return codegen


@intrinsic
def store_floats(typingctx, array, index, vector):
    """array[index: 16 on] = vector (a float32 array)."""
    return types.none(array, index, vector), _store_codegen(_FLOATS)


@intrinsic
def store_ints(typingctx, array, index, vector):
    """array[index: 16 on] = vector (a 32-bit integer array)."""
    return types.none(array, index, vector), _store_codegen(_INTS)


def _nibbles(builder, lanes, shift):
    """IR of bits shift..shift+3 of each int32 lane."""
    shifted = builder.lshr(lanes, _splat(builder, _int32(builder, shift), _INTS))
    return builder.and_(shifted, ir.Constant(_INTS, [15] * LANES))


def _nibble_pairs(builder, lanes, shift):
    """IR of bits shift..shift+3 of each 16-bit half of each lane, as _PAIRS."""
    shifted = builder.lshr(builder.bitcast(lanes, _PAIRS),
                           _splat(builder, builder.trunc(shift, _I16), _PAIRS))
    return builder.and_(shifted, ir.Constant(_PAIRS, [15] * 2 * LANES))


@intrinsic
def nibbles(typingctx, lanes, shift):
    """Bits shift..shift+3 of each lane, as int32 in 0..15."""
    def codegen(context, builder, sig, args):
        return _nibbles(builder, *args)
    return ints(lanes, shift), codegen


@intrinsic
def signed_bytes(typingctx, lanes, byte):
    """Byte `byte` (0..3) of each lane, as int8 sign-extended to int32."""
    def codegen(context, builder, sig, args):
        up = builder.sub(ir.Constant(_I32, 24),
                         builder.mul(_int32(builder, args[1]), ir.Constant(_I32, 8)))
        shifted = builder.shl(args[0], _splat(builder, up, _INTS))
        return builder.ashr(shifted, ir.Constant(_INTS, [24] * LANES))
    return ints(lanes, byte), codegen


@intrinsic
def nibble_pairs(typingctx, lanes, shift):
    """Bits shift..shift+3 of each 16-bit half of each lane: a pair of int16 in 0..15."""
    def codegen(context, builder, sig, args):
        return builder.bitcast(_nibble_pairs(builder, *args), _INTS)
    return ints(lanes, shift), codegen


@intrinsic
def six_bit_pairs(typingctx, nibble_lanes, nibble_shift, crumb_lanes, crumb_shift):
    """Pairs of int16 in 0..63 (a pair a lane), each half's bits 0..3 from bits
    nibble_shift.. of the same half of `nibble_lanes` and bits 4..5 from bits
    4 + crumb_shift.. of the same half of `crumb_lanes` (a negative crumb_shift: bits
    below 4). Constant shifts fold to one shift each."""
    def codegen(context, builder, sig, args):
        nib, nib_shift, crumbs, crumb_shift = args
        low = _nibble_pairs(builder, nib, nib_shift)
        halves = builder.bitcast(crumbs, _PAIRS)
        shift = builder.trunc(crumb_shift, _I16)
        right = builder.lshr(halves, _splat(builder, shift, _PAIRS))
        left = builder.shl(halves, _splat(builder, builder.neg(shift), _PAIRS))
        up = builder.select(builder.icmp_signed(">=", shift, ir.Constant(_I16, 0)), right, left)
        high = builder.and_(up, ir.Constant(_PAIRS, [48] * 2 * LANES))
        return builder.bitcast(builder.or_(low, high), _INTS)
    return ints(nibble_lanes, nibble_shift, crumb_lanes, crumb_shift), codegen


@intrinsic
def six_bits(typingctx, nibble_lanes, nibble_shift, crumb_lanes, crumb_shift):
    """int32 lanes in 0..63: bits 0..3 from bits nibble_shift.. of `nibble_lanes`, bits
    4..5 from bits crumb_shift.. of `crumb_lanes`."""
    def codegen(context, builder, sig, args):
        nib, nib_shift, crumbs, crumb_shift = args
        low = _nibbles(builder, nib, nib_shift)
        high = builder.lshr(crumbs, _splat(builder, _int32(builder, crumb_shift), _INTS))
        high = builder.shl(builder.and_(high, ir.Constant(_INTS, [3] * LANES)),
                           ir.Constant(_INTS, [4] * LANES))
        return builder.or_(low, high)
    return ints(nibble_lanes, nibble_shift, crumb_lanes, crumb_shift), codegen


def _byte_pairs(high: bool):
    """Codegen of the high or the low bytes of each 16-bit half, sign-extended."""
    def codegen(context, builder, sig, args):
        halves = builder.bitcast(args[0], _PAIRS)
        eight = ir.Constant(_PAIRS, [8] * 2 * LANES)
        if not high:
            halves = builder.shl(halves, eight)
        return builder.bitcast(builder.ashr(halves, eight), _INTS)
    return codegen


@intrinsic
def low_byte_pairs(typingctx, lanes):
    """Bytes 0 and 2 of each lane, sign-extended: a pair of int16 in -128..127."""
    return ints(lanes), _byte_pairs(high=False)


@intrinsic
def high_byte_pairs(typingctx, lanes):
    """Bytes 1 and 3 of each lane, sign-extended: a pair of int16 in -128..127."""
    return ints(lanes), _byte_pairs(high=True)


@intrinsic
def dot_pairs(typingctx, acc, pairs, word):
    """acc + lo(pairs) * lo(word) + hi(pairs) * hi(word) lane by lane, lo and hi the int16
    halves of each lane and of the int32 `word` (pmaddwd and an add; vpdpwssd).
    No sum wraps while no pair is (-32768, -32768) in both."""
    def codegen(context, builder, sig, args):
        acc, pairs, word = args
        broadcast = builder.bitcast(_splat(builder, _int32(builder, word), _INTS), _PAIRS)
        products = builder.mul(builder.sext(builder.bitcast(pairs, _PAIRS), _WIDE),
                               builder.sext(broadcast, _WIDE))
        even, odd = (builder.shuffle_vector(products, products,
                                            ir.Constant(_INTS, list(range(first, 2 * LANES, 2))))
                     for first in (0, 1))
        return builder.add(acc, builder.add(even, odd))
    return ints(acc, pairs, word), codegen


@intrinsic
def multiply_add(typingctx, acc, a, b):
    """acc + a * b lane by lane (float32 lanes; int32 lanes of `a` are converted; a float
    `b` is used in every lane)."""
    def codegen(context, builder, sig, args):
        acc, a, b = args
        if sig.args[1] == ints:
            a = builder.sitofp(a, _FLOATS)
        if sig.args[2] != floats:
            b = _splat(builder, context.cast(builder, b, sig.args[2], types.float32), _FLOATS)
        # fmuladd: fused where the CPU has FMA, a multiply and an add where not
        fmuladd = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(_FLOATS, [_FLOATS] * 3), "llvm.fmuladd.v16f32")
        return builder.call(fmuladd, [a, b, acc])
    return floats(acc, a, b), codegen

