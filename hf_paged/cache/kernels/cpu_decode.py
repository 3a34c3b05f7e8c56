"""Paged attention on the CPU with 8-lane vectors (`cpu_simd`): a decode, or a short chunk's queries (speculative
verification, a prompt's last few tokens), over a sequence's keys.

The scalar kernels (`cpu_attention._decode_seq`, `_chunk_seq`) compute each (key, query, head) score as its own dot
product; the compiler vectorizes each over the head's dimensions and ends every one in a horizontal sum, and their
value pass loads and stores each head's accumulator at every key. Here (head_dim a multiple of 8, caches
C-contiguous, no soft-capping):

    scores  eight keys of a block at a time, per query and head: eight independent multiply-add chains over the
            head's dimensions, their eight sums in one shuffle tree, one 8-wide store (a block's last < 8 keys one
            by one). A chunk's query also scores the chunk's later keys; its softmax covers its own causal (and
            window) range and the rest of its row is zeroed
    values  per block (its rows stay in L1), KV head and query: 4 query heads x one 8-lane slice, or 4 slices of one
            query head for the rest of a GQA group; each accumulator in registers over the block's keys, split into
            even and odd keys (two chains), added to the output once a block

The same keys and values as the scalar kernels are read (a sequence's own slots lo .. length - 1 only), with the
next block prefetched; the sums are ordered otherwise (fp32 rounding: within the kernel tests' tolerance of the
dense oracle). One thread, AMD EPYC with AVX2, 8 heads of 32 (`benchmarks/throughput_kernel.py --before 3bfffa8`):
decodes 0.58-0.72x the scalar kernel's time a key where the blocks stay in cache, 0.77-1.00x scattered over a pool
larger than the caches (4 KV heads there: 1 KB a key at ~14 GB/s, that box's rate for 4 KB blocks in random order,
binds both kernels); prompt-lookup speculation's chunks of 5-9 queries half the time (`benchmarks/speculative.py`).
"""

from __future__ import annotations

from numba import njit

from hf_paged.background_compile import sources_digest
from hf_paged.cache.kernels.cpu_prefetch import CPU_KERNEL_SOURCES, prefetch_lines
from hf_paged.cache.kernels.cpu_simd import softmax_row, vadd, vfma, vload, vscale, vsplat, vstore, vsum, vsum8, vzero
from hf_paged.compat import seal_numba_cache

__all__ = ["attend_seq_vectorized"]


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _scores(q, q0, q_len, key_cache, value_cache, table, lo, length, scale, scores):
    """scores[r * heads + head, t - lo] for queries q0 .. q0 + q_len - 1 and every key lo .. length - 1 (a chunk's
    queries score their own later keys too: `attend_seq_vectorized` zeroes those after the softmax)."""
    bs, num_kv_heads, dim = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    heads = q.shape[1]
    g = heads // num_kv_heads
    row = num_kv_heads * dim  # floats per token row (every KV head)
    block_bytes = bs * row * 4
    width = scores.shape[1]
    first, last = lo // bs, (length - 1) // bs
    for blk in range(first, last + 1):
        base = table[blk] * bs * row - blk * bs * row  # + t * row: token t's row, flat in the pool
        t, end = max(lo, blk * bs), min(length, blk * bs + bs)
        ahead = (key_cache.ctypes.data + table[blk + 1] * block_bytes if blk < last
                 else value_cache.ctypes.data + table[first] * block_bytes)
        while t + 8 <= end:
            for h in range(num_kv_heads):
                k = base + t * row + h * dim
                for r in range(q_len):
                    for j in range(g):
                        if r == 0 and h * g + j < 8:  # the next block's row at this one's offset, one a dot product
                            prefetch_lines(ahead + (t + h * g + j - blk * bs) * row * 4, row * 4)
                        qh = ((q0 + r) * heads + h * g + j) * dim
                        a0 = vzero(); a1 = vzero(); a2 = vzero(); a3 = vzero()  # noqa: E702
                        a4 = vzero(); a5 = vzero(); a6 = vzero(); a7 = vzero()  # noqa: E702
                        for c in range(0, dim, 8):
                            x = vload(q, qh + c)
                            a0 = vfma(x, vload(key_cache, k + c), a0)
                            a1 = vfma(x, vload(key_cache, k + row + c), a1)
                            a2 = vfma(x, vload(key_cache, k + 2 * row + c), a2)
                            a3 = vfma(x, vload(key_cache, k + 3 * row + c), a3)
                            a4 = vfma(x, vload(key_cache, k + 4 * row + c), a4)
                            a5 = vfma(x, vload(key_cache, k + 5 * row + c), a5)
                            a6 = vfma(x, vload(key_cache, k + 6 * row + c), a6)
                            a7 = vfma(x, vload(key_cache, k + 7 * row + c), a7)
                        vstore(scores, (r * heads + h * g + j) * width + t - lo,
                               vscale(vsum8(a0, a1, a2, a3, a4, a5, a6, a7), scale))
            for left in range(heads, 8):  # rows the dot products above did not ask for
                prefetch_lines(ahead + (t + left - blk * bs) * row * 4, row * 4)
            t += 8
        while t < end:
            prefetch_lines(ahead + (t - blk * bs) * row * 4, row * 4)
            for h in range(num_kv_heads):
                k = base + t * row + h * dim
                for r in range(q_len):
                    for j in range(g):
                        qh = ((q0 + r) * heads + h * g + j) * dim
                        a0 = vzero()
                        for c in range(0, dim, 8):
                            a0 = vfma(vload(q, qh + c), vload(key_cache, k + c), a0)
                        scores[r * heads + h * g + j, t - lo] = vsum(a0) * scale
            t += 1


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _four_heads(scores, r, lo, value_cache, v, row, t0, t1, acc, o, dim):
    """acc rows r .. r + 3 (flat offset o, lanes c .. c + 7) += their probabilities x keys t0 .. t1 - 1's values at
    flat offsets v + t * row."""
    a0 = vzero(); a1 = vzero(); a2 = vzero(); a3 = vzero()  # noqa: E702
    b0 = vzero(); b1 = vzero(); b2 = vzero(); b3 = vzero()  # noqa: E702
    t = t0
    while t + 2 <= t1:
        x, y = vload(value_cache, v + t * row), vload(value_cache, v + (t + 1) * row)
        s = t - lo
        a0 = vfma(vsplat(scores[r, s]), x, a0)
        b0 = vfma(vsplat(scores[r, s + 1]), y, b0)
        a1 = vfma(vsplat(scores[r + 1, s]), x, a1)
        b1 = vfma(vsplat(scores[r + 1, s + 1]), y, b1)
        a2 = vfma(vsplat(scores[r + 2, s]), x, a2)
        b2 = vfma(vsplat(scores[r + 2, s + 1]), y, b2)
        a3 = vfma(vsplat(scores[r + 3, s]), x, a3)
        b3 = vfma(vsplat(scores[r + 3, s + 1]), y, b3)
        t += 2
    if t < t1:
        x = vload(value_cache, v + t * row)
        s = t - lo
        a0 = vfma(vsplat(scores[r, s]), x, a0)
        a1 = vfma(vsplat(scores[r + 1, s]), x, a1)
        a2 = vfma(vsplat(scores[r + 2, s]), x, a2)
        a3 = vfma(vsplat(scores[r + 3, s]), x, a3)
    vstore(acc, o, vadd(vload(acc, o), vadd(a0, b0)))
    vstore(acc, o + dim, vadd(vload(acc, o + dim), vadd(a1, b1)))
    vstore(acc, o + 2 * dim, vadd(vload(acc, o + 2 * dim), vadd(a2, b2)))
    vstore(acc, o + 3 * dim, vadd(vload(acc, o + 3 * dim), vadd(a3, b3)))


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _four_slices(scores, r, lo, value_cache, v, row, t0, t1, acc, o):
    """acc row r's lanes at flat o .. o + 31 += its probabilities x the values' lanes at v + t * row .. + 31."""
    a0 = vzero(); a1 = vzero(); a2 = vzero(); a3 = vzero()  # noqa: E702
    b0 = vzero(); b1 = vzero(); b2 = vzero(); b3 = vzero()  # noqa: E702
    t = t0
    while t + 2 <= t1:
        x, y = vsplat(scores[r, t - lo]), vsplat(scores[r, t + 1 - lo])
        e, f = v + t * row, v + (t + 1) * row
        a0 = vfma(x, vload(value_cache, e), a0)
        a1 = vfma(x, vload(value_cache, e + 8), a1)
        a2 = vfma(x, vload(value_cache, e + 16), a2)
        a3 = vfma(x, vload(value_cache, e + 24), a3)
        b0 = vfma(y, vload(value_cache, f), b0)
        b1 = vfma(y, vload(value_cache, f + 8), b1)
        b2 = vfma(y, vload(value_cache, f + 16), b2)
        b3 = vfma(y, vload(value_cache, f + 24), b3)
        t += 2
    if t < t1:
        x, e = vsplat(scores[r, t - lo]), v + t * row
        a0 = vfma(x, vload(value_cache, e), a0)
        a1 = vfma(x, vload(value_cache, e + 8), a1)
        a2 = vfma(x, vload(value_cache, e + 16), a2)
        a3 = vfma(x, vload(value_cache, e + 24), a3)
    vstore(acc, o, vadd(vload(acc, o), vadd(a0, b0)))
    vstore(acc, o + 8, vadd(vload(acc, o + 8), vadd(a1, b1)))
    vstore(acc, o + 16, vadd(vload(acc, o + 16), vadd(a2, b2)))
    vstore(acc, o + 24, vadd(vload(acc, o + 24), vadd(a3, b3)))


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _one_slice(scores, r, lo, value_cache, v, row, t0, t1, acc, o):
    a0 = vzero(); b0 = vzero()  # noqa: E702
    t = t0
    while t + 2 <= t1:
        a0 = vfma(vsplat(scores[r, t - lo]), vload(value_cache, v + t * row), a0)
        b0 = vfma(vsplat(scores[r, t + 1 - lo]), vload(value_cache, v + (t + 1) * row), b0)
        t += 2
    if t < t1:
        a0 = vfma(vsplat(scores[r, t - lo]), vload(value_cache, v + t * row), a0)
    vstore(acc, o, vadd(vload(acc, o), vadd(a0, b0)))


@njit(cache=True, nogil=True, fastmath=True, inline="always")
def _values(value_cache, table, lo, length, scores, acc, heads, q_len):
    bs, num_kv_heads, dim = value_cache.shape[1], value_cache.shape[2], value_cache.shape[3]
    g = heads // num_kv_heads
    row = num_kv_heads * dim
    block_bytes = bs * row * 4
    first, last = lo // bs, (length - 1) // bs
    acc[: q_len * heads] = 0.0
    for blk in range(first, last + 1):
        t0, t1 = max(lo, blk * bs), min(length, blk * bs + bs)
        base = table[blk] * bs * row - blk * bs * row
        ahead = value_cache.ctypes.data + table[blk + 1] * block_bytes if blk < last else 0
        fetched = 0  # rows of the next block asked for: one before each pass over this block's rows
        for h in range(num_kv_heads):
            for r in range(q_len):  # KV head h of query r: score rows r * heads + h * g ..
                first_row = r * heads + h * g
                j = 0
                while j + 4 <= g:
                    for c in range(0, dim, 8):
                        if ahead and fetched < bs:
                            prefetch_lines(ahead + fetched * row * 4, row * 4)
                            fetched += 1
                        _four_heads(scores, first_row + j, lo, value_cache, base + h * dim + c, row, t0, t1, acc,
                                    (first_row + j) * dim + c, dim)
                    j += 4
                while j < g:
                    c, one = 0, first_row + j
                    if ahead and fetched < bs:
                        prefetch_lines(ahead + fetched * row * 4, row * 4)
                        fetched += 1
                    while c + 32 <= dim:
                        _four_slices(scores, one, lo, value_cache, base + h * dim + c, row, t0, t1, acc, one * dim + c)
                        c += 32
                    while c < dim:
                        _one_slice(scores, one, lo, value_cache, base + h * dim + c, row, t0, t1, acc, one * dim + c)
                        c += 8
                    j += 1
        if ahead and fetched < bs:
            prefetch_lines(ahead + fetched * row * 4, (bs - fetched) * row * 4)


@njit(cache=True, nogil=True, fastmath=True)
def attend_seq_vectorized(q, q0, q_len, key_cache, value_cache, table, lo, length, window, scale, scores, acc, out):
    """`cpu_attention`'s `_decode_seq` / `_chunk_seq` with 8-lane vectors: queries q0 .. q0 + q_len - 1 (positions
    length - q_len ..) of every head over keys lo .. length - 1, each query over its own causal (and window) range;
    head_dim % 8 == 0 and q, both caches, scores [rows, >= length - lo] and acc [rows, head_dim] C-contiguous."""
    heads = q.shape[1]
    first = length - q_len
    _scores(q, q0, q_len, key_cache, value_cache, table, lo, length, scale, scores)
    for r in range(q_len):  # query r sees keys start .. first + r; the rest of its row is zeroed
        p = first + r
        start = lo if window <= 0 else max(lo, p - window + 1)
        for head in range(heads):
            s = scores[r * heads + head]
            softmax_row(s[start - lo : p - lo + 1], p - start + 1)
            s[: start - lo] = 0.0
            s[p - lo + 1 : length - lo] = 0.0
    _values(value_cache, table, lo, length, scores, acc, heads, q_len)
    for r in range(q_len):
        for head in range(heads):
            out[q0 + r, head] = acc[r * heads + head]


seal_numba_cache(list(globals().values()), sources_digest(*CPU_KERNEL_SOURCES))
