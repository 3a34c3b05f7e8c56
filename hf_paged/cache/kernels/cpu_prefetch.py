"""A software prefetch for the numba kernels: `prefetch_lines(address, nbytes)` asks for the cache lines of a byte
range ahead of the loop that reads them.

Why: a decode reads each sequence's keys, then its values, block after block, and a sequence's blocks lie anywhere
in the pool. The hardware prefetchers follow a stream only within a 4 KB page and start over at each block, so at
batch 64 (contexts far larger than the caches) the kernel waited on memory for about half its time. Asking for the
next block's rows while the current block is read hides most of that wait (the kernel alone: 145 -> 110 ns per key
with 4 KV heads, 102 -> 70 with 2; `benchmarks/throughput_kernel.py`). A prefetch never faults and reads nothing
into a value; the arithmetic is the same (the compiler may order a fastmath dot product's partial sums otherwise
around it: fp32 rounding, checked against the dense oracle by the kernel tests).
"""

from __future__ import annotations

from llvmlite import ir
from numba import njit, types
from numba.core.extending import intrinsic

from hf_paged.background_compile import sources_digest
from hf_paged.compat import seal_numba_cache

# what the CPU attention kernels compile from (they inline each other's helpers): their cache is keyed on all seven
CPU_KERNEL_SOURCES = ("cache/kernels/cpu_attention.py", "cache/kernels/cpu_decode.py", "cache/kernels/cpu_dequant.py",
                      "cache/kernels/cpu_prefetch.py", "cache/kernels/cpu_quantized.py",
                      "cache/kernels/cpu_quantized_decode.py", "cache/kernels/cpu_simd.py")

__all__ = ["prefetch_lines"]

_LINE = 64  # bytes per cache line (x86-64, and the common Arm cores)


@intrinsic
def _prefetch(typingctx, address):
    """LLVM's prefetch hint for the line holding integer `address`: a read, kept in every cache level."""
    if not isinstance(address, types.Integer):
        return None

    def codegen(context, builder, signature, args):
        byte_ptr, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
        fn = builder.module.declare_intrinsic("llvm.prefetch", [byte_ptr],
                                              ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]))
        builder.call(fn, [builder.inttoptr(args[0], byte_ptr), i32(0), i32(3), i32(1)])  # read, locality 3, data
        return context.get_dummy_value()

    return types.none(address), codegen


@njit(cache=True, nogil=True, inline="always")
def prefetch_lines(address, nbytes):
    """Hint every cache line of `address .. address + nbytes - 1` (a hint: nothing is read, nothing can fault)."""
    for offset in range(0, nbytes, _LINE):
        _prefetch(address + offset)


seal_numba_cache(list(globals().values()), sources_digest(*CPU_KERNEL_SOURCES))  # keyed on all 7 files
