"""A decode over a quantized cache in 8-lane vectors (`cpu_simd`), for head_dim a multiple of 8 and int8 / fp8 parts
(int4 stays with the scalar kernel: `vector_decode_applies`).

`cpu_quantized`'s scalar decode converts every key element once per query head (int8 read as is, the scale out of
the dot product) and ends each (key, head) dot product in a horizontal sum. Here, per KV head, each block is
dequantized once into a float32 scratch block, then read as `cpu_decode` reads a plain block:

    scores  eight keys at a time per query head: eight multiply-add chains over the head's dimensions, their sums in
            one shuffle tree (`vsum8`), one 8-wide store; the block being written is read from the full-precision
            tail in place (the same rule as the scalar kernel: the last block comes from the tail unless the query
            fills it)
    values  per block, 4 query heads x one 8-lane slice (or 4 slices of one head for the rest of a GQA group),
            accumulated in registers over the block's keys (`cpu_decode._four_heads` and its siblings)

Same keys, values and softmax as the scalar kernel; the sums are ordered otherwise, and an int8 scale is applied per
element instead of factored out (fp32 rounding, within the kernel tests' tolerance of the dense oracle).
"""

from __future__ import annotations

from numba import njit

from hf_paged.background_compile import sources_digest
from hf_paged.cache.kernels.cpu_decode import _four_heads, _four_slices, _one_slice
from hf_paged.cache.kernels.cpu_dequant import INT4, PLAIN, _copy_block, _dequant_block
from hf_paged.cache.kernels.cpu_prefetch import CPU_KERNEL_SOURCES
from hf_paged.cache.kernels.cpu_simd import softmax_row, vfma, vload, vscale, vstore, vsum, vsum8, vzero
from hf_paged.compat import seal_numba_cache

__all__ = ["decode_head_vectorized", "vector_decode_applies"]


@njit(cache=True, nogil=True, inline="always")
def vector_decode_applies(q, tail_k, tail_v, k_fmt, v_fmt) -> bool:
    """head_dim a multiple of 8, the query and the tail C-contiguous (the vectors address them flat), and no int4
    part: the scalar kernel reads int4 without dequantizing (keys: (q * scale) . nibbles; values: the zero point
    taken off once), faster than a dequantized block's vectors (64 decodes of 40-1,250 keys, 8 heads of 32:
    int4 1.2x the scalar kernel's time, int8 0.75x, fp8 0.5x)."""
    return (q.shape[2] % 8 == 0 and q.flags.c_contiguous and tail_k.flags.c_contiguous
            and tail_v.flags.c_contiguous and k_fmt != INT4 and v_fmt != INT4)


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _key_scores(q, qh, src, base, row, n, scale, scores, j, col):
    """scores[j, col .. col + n - 1] = scale * q's flat [qh, qh + dim) . key k, key k at src's flat elements
    base + k * row .. (dim of them), eight keys at a time."""
    dim = q.shape[2]
    at = j * scores.shape[1] + col
    k = 0
    while k + 8 <= n:
        a0 = vzero(); a1 = vzero(); a2 = vzero(); a3 = vzero()  # noqa: E702
        a4 = vzero(); a5 = vzero(); a6 = vzero(); a7 = vzero()  # noqa: E702
        p = base + k * row
        for c in range(0, dim, 8):
            x = vload(q, qh + c)
            a0 = vfma(x, vload(src, p + c), a0)
            a1 = vfma(x, vload(src, p + row + c), a1)
            a2 = vfma(x, vload(src, p + 2 * row + c), a2)
            a3 = vfma(x, vload(src, p + 3 * row + c), a3)
            a4 = vfma(x, vload(src, p + 4 * row + c), a4)
            a5 = vfma(x, vload(src, p + 5 * row + c), a5)
            a6 = vfma(x, vload(src, p + 6 * row + c), a6)
            a7 = vfma(x, vload(src, p + 7 * row + c), a7)
        vstore(scores, at + k, vscale(vsum8(a0, a1, a2, a3, a4, a5, a6, a7), scale))
        k += 8
    while k < n:
        a0 = vzero()
        p = base + k * row
        for c in range(0, dim, 8):
            a0 = vfma(vload(q, qh + c), vload(src, p + c), a0)
        scores[j, col + k] = vsum(a0) * scale
        k += 1


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _add_values(scores, g, lo, src, v, row, t0, t1, acc, dim):
    """acc rows 0 .. g - 1 += their probabilities (scores' columns t - lo) x value t, at src's flat v + t * row
    .. (dim of them), for t in t0 .. t1 - 1."""
    j = 0
    while j + 4 <= g:
        for c in range(0, dim, 8):
            _four_heads(scores, j, lo, src, v + c, row, t0, t1, acc, j * dim + c, dim)
        j += 4
    while j < g:
        c = 0
        while c + 32 <= dim:
            _four_slices(scores, j, lo, src, v + c, row, t0, t1, acc, j * dim + c)
            c += 32
        while c < dim:
            _one_slice(scores, j, lo, src, v + c, row, t0, t1, acc, j * dim + c)
            c += 8
        j += 1


@njit(cache=True, nogil=True, inline="always")
def _fill(data, scale, zero, fmt, layout, log_scale, b, h, rows, channel, block):
    """Rows 0 .. rows - 1 of block b, KV head h, as float32 in `block` [bs, D]."""
    if fmt == PLAIN:  # a full-precision part beside a quantized one
        _copy_block(data, b, h, rows, block)
    else:
        _dequant_block(data, scale, zero, fmt, layout, log_scale, b, h, rows, channel, block)


@njit(cache=True, nogil=True, fastmath=True)
def decode_head_vectorized(q, q0, h, g, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero, v_fmt,
                           v_layout, log_scale, tail_k, tail_v, tail_table, table, lo, length, scale, scores, acc,
                           out, block, channel):
    """`cpu_quantized._decode_head_quantized` (the same arguments; `vector_decode_applies` holds, `block` [bs, D] and
    `scores`, `acc` C-contiguous): KV head h's g query heads of query row q0 over keys lo .. length - 1."""
    bs, num_kv_heads, dim = tail_k.shape[1], tail_k.shape[2], tail_k.shape[3]
    heads = q.shape[1]
    tail_row = num_kv_heads * dim  # floats per token row of the tail (every KV head)
    open_block = (length - 1) // bs if length % bs else -1  # the block not yet quantized
    flat_block = block.reshape(bs * dim)
    keys_tail, values_tail = tail_k.reshape(tail_k.size), tail_v.reshape(tail_v.size)
    for blk in range(lo // bs, (length + bs - 1) // bs):
        t0, t1 = max(lo, blk * bs), min(length, blk * bs + bs)
        if blk == open_block:
            src, row = keys_tail, tail_row
            base = (tail_table[blk] * bs * num_kv_heads + h) * dim + (t0 - blk * bs) * row
        else:
            _fill(k_data, k_scale, k_zero, k_fmt, k_layout, log_scale, table[blk], h, t1 - blk * bs, channel, block)
            src, row, base = flat_block, dim, (t0 - blk * bs) * dim
        for j in range(g):
            _key_scores(q, (q0 * heads + h * g + j) * dim, src, base, row, t1 - t0, scale, scores, j, t0 - lo)
    for j in range(g):
        softmax_row(scores[j], length - lo)
    acc[:g] = 0.0
    for blk in range(lo // bs, (length + bs - 1) // bs):
        t0, t1 = max(lo, blk * bs), min(length, blk * bs + bs)
        if blk == open_block:  # value t at (tail block * bs + t - blk * bs) * tail_row + h * dim
            src, row = values_tail, tail_row
            v = (tail_table[blk] * bs * num_kv_heads + h) * dim - blk * bs * row
        else:
            _fill(v_data, v_scale, v_zero, v_fmt, v_layout, log_scale, table[blk], h, t1 - blk * bs, channel, block)
            src, row, v = flat_block, dim, -blk * bs * dim
        _add_values(scores, g, lo, src, v, row, t0, t1, acc, dim)
    for j in range(g):
        out[q0, h * g + j] = acc[j]


seal_numba_cache(list(globals().values()), sources_digest(*CPU_KERNEL_SOURCES))
