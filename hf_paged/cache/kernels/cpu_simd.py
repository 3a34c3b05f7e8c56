"""Eight fp32 lanes as one value in numba kernels (`f32x8`), and the vectorized softmax of a score row.

Why: numba hands the compiler scalar loops, and over a head's 32-128 dimensions the compiler's vectorized dot product
ends in a horizontal sum and a loop epilogue for every (key, head) pair: the decode kernel spent ~70 ns a key row
(8 heads of 32) where the arithmetic needs ~10. With the lanes as a value, a kernel keeps its accumulators in
registers across keys, sums eight dot products in one shuffle tree (`vsum8`), and fuses multiply-adds
(`cpu_decode`). LLVM lowers an 8-lane vector to one AVX register, two SSE or NEON registers elsewhere.

`vload`/`vstore` address an array by a flat element index from its first element, without a bounds check: the
caller passes C-contiguous float32 arrays and indices it has proved in range.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.core.extending import intrinsic, models, register_model

from hf_paged.background_compile import sources_digest
from hf_paged.cache.kernels.cpu_prefetch import CPU_KERNEL_SOURCES
from hf_paged.compat import seal_numba_cache

__all__ = ["f32x8", "softmax_row", "vadd", "vfma", "vload", "vscale", "vsplat", "vstore", "vsum", "vsum8", "vzero"]

_LANES = ir.VectorType(ir.FloatType(), 8)


class F32x8(types.Type):
    def __init__(self):
        super().__init__(name="f32x8")


f32x8 = F32x8()


@register_model(F32x8)
class _F32x8Model(models.PrimitiveModel):
    def __init__(self, dmm, fe_type):
        super().__init__(dmm, fe_type, _LANES)


def _is_f32_array(arr) -> bool:
    return isinstance(arr, types.Array) and arr.dtype == types.float32


def _address(context, builder, arrty, arr, index):
    data = context.make_array(arrty)(context, builder, arr).data
    return builder.bitcast(builder.gep(builder.bitcast(data, ir.FloatType().as_pointer()), [index]),
                           _LANES.as_pointer())


def _shuffle(builder, a, b, lanes):
    return builder.shuffle_vector(a, b, ir.Constant(ir.VectorType(ir.IntType(32), len(lanes)), lanes))


def _splat(builder, x):
    one = builder.insert_element(ir.Constant(_LANES, ir.Undefined), x, ir.Constant(ir.IntType(32), 0))
    return _shuffle(builder, one, one, [0] * 8)


@intrinsic
def vload(typingctx, arr, index):
    """arr's elements index .. index + 7, counted flat from its first element."""
    if not (_is_f32_array(arr) and isinstance(index, types.Integer)):
        return None

    def codegen(context, builder, signature, args):
        return builder.load(_address(context, builder, arr, args[0], args[1]), align=4)

    return f32x8(arr, index), codegen


@intrinsic
def vstore(typingctx, arr, index, value):
    """Write `value` to arr's elements index .. index + 7 (flat)."""
    if not (_is_f32_array(arr) and isinstance(index, types.Integer) and value == f32x8):
        return None

    def codegen(context, builder, signature, args):
        builder.store(args[2], _address(context, builder, arr, args[0], args[1]), align=4)
        return context.get_dummy_value()

    return types.none(arr, index, value), codegen


@intrinsic
def vzero(typingctx):
    def codegen(context, builder, signature, args):
        return ir.Constant(_LANES, [0.0] * 8)

    return f32x8(), codegen


@intrinsic
def vsplat(typingctx, x):
    """x in every lane."""
    if x != types.float32:
        return None

    def codegen(context, builder, signature, args):
        return _splat(builder, args[0])

    return f32x8(x), codegen


@intrinsic
def vadd(typingctx, a, b):
    if not (a == b == f32x8):
        return None

    def codegen(context, builder, signature, args):
        return builder.fadd(args[0], args[1])

    return f32x8(a, b), codegen


@intrinsic
def vscale(typingctx, a, x):
    """a * x in every lane (x a float32 scalar)."""
    if not (a == f32x8 and x == types.float32):
        return None

    def codegen(context, builder, signature, args):
        return builder.fmul(args[0], _splat(builder, args[1]))

    return f32x8(a, x), codegen


@intrinsic
def vfma(typingctx, a, b, c):
    """a * b + c in every lane: one fused instruction where the CPU has FMA (`llvm.fmuladd`: a multiply and an add
    elsewhere, where `llvm.fma` would call libm's `fmaf` lane by lane)."""
    if not (a == b == c == f32x8):
        return None

    def codegen(context, builder, signature, args):
        fn_type = ir.FunctionType(_LANES, [_LANES] * 3)
        return builder.call(cgutils.get_or_insert_function(builder.module, fn_type, "llvm.fmuladd.v8f32"), args)

    return f32x8(a, b, c), codegen


@intrinsic
def vsum(typingctx, a):
    """The sum of a's lanes: (0 + 4, 1 + 5, ..), then halves again."""
    if a != f32x8:
        return None

    def codegen(context, builder, signature, args):
        v = args[0]
        for width in (4, 2, 1):
            v = builder.fadd(_shuffle(builder, v, v, list(range(width))),
                             _shuffle(builder, v, v, list(range(width, 2 * width))))
        return builder.extract_element(v, ir.Constant(ir.IntType(32), 0))

    return types.float32(a), codegen


@intrinsic
def vsum8(typingctx, a0, a1, a2, a3, a4, a5, a6, a7):
    """[sum(a0), sum(a1), .., sum(a7)]: eight horizontal sums as one vector, by pairwise sums within each 128-bit
    half (the pattern of x86's `vhaddps`), then the halves."""
    if not all(a == f32x8 for a in (a0, a1, a2, a3, a4, a5, a6, a7)):
        return None

    def codegen(context, builder, signature, args):
        def pairs(x, y):  # [x0+x1, x2+x3, y0+y1, y2+y3, x4+x5, x6+x7, y4+y5, y6+y7]
            return builder.fadd(_shuffle(builder, x, y, [0, 2, 8, 10, 4, 6, 12, 14]),
                                _shuffle(builder, x, y, [1, 3, 9, 11, 5, 7, 13, 15]))

        h = [pairs(args[i], args[i + 1]) for i in range(0, 8, 2)]
        low, high = pairs(h[0], h[1]), pairs(h[2], h[3])  # [s0 s1 s2 s3 | s0 s1 s2 s3] halves of a0..a3, a4..a7
        return builder.fadd(_shuffle(builder, low, high, [0, 1, 2, 3, 8, 9, 10, 11]),
                            _shuffle(builder, low, high, [4, 5, 6, 7, 12, 13, 14, 15]))

    return f32x8(a0, a1, a2, a3, a4, a5, a6, a7), codegen


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def softmax_row(s, width):
    """s[:width] (one query's scores, all valid) -> its probabilities, in place.

    exp by Cephes' expf polynomial, in loops the compiler vectorizes (numba's `np.exp` is a scalar libm call
    there: 2.3x slower over a row): x = s - max <= 0 is clamped at -87 (exp(-87) ~ 1.6e-38, nothing beside the
    row's 1), x = k ln2 + r with |r| <= ln2 / 2, exp(r) by a degree-7 polynomial (1-2 ulp, as libm), 2^k as the
    bits of a float."""
    m = s[0]
    for c in range(1, width):
        m = max(m, s[c])
    bits = np.empty(width, np.int32)
    for c in range(width):
        x = max(s[c] - m, np.float32(-87.0))
        k = np.floor(x * np.float32(1.44269504) + np.float32(0.5))
        r = x - k * np.float32(0.693359375) + k * np.float32(2.12194440e-4)  # ln 2 in two parts
        p = np.float32(1.9875691500e-4)
        p = p * r + np.float32(1.3981999507e-3)
        p = p * r + np.float32(8.3334519073e-3)
        p = p * r + np.float32(4.1665795894e-2)
        p = p * r + np.float32(1.6666665459e-1)
        p = p * r + np.float32(5.0000001201e-1)
        s[c] = p * r * r + r + np.float32(1.0)
        bits[c] = (np.int32(k) + np.int32(127)) << np.int32(23)
    two_k = bits.view(np.float32)
    total = np.float32(0.0)
    for c in range(width):
        e = s[c] * two_k[c]
        s[c] = e
        total += e
    inv = np.float32(1.0) / total
    for c in range(width):
        s[c] *= inv


seal_numba_cache(list(globals().values()), sources_digest(*CPU_KERNEL_SOURCES))
