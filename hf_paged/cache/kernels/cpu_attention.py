"""Paged attention on the CPU (numba): each query reads its keys and values where they lie in the block pool.

The torch path gathers every scheduled sequence's blocks into a fresh tensor on every layer and step (and, for a
quantized cache, dequantizes them into one first); that copy cost as much as the attention arithmetic. These
kernels walk the block tables instead: one pass over a sequence's keys computes the scores of all its queries (every
query head, GQA groups included, and every query position of a short chunk), a softmax over each query's own range,
one pass over the values: each key and value row, every KV head of it, is read once. Nothing outside a sequence's own slots `0 .. context_len - 1` is
read, so unwritten slots never matter, and nothing is copied.

    sequence i: queries qsl[i] .. qsl[i+1]-1 sit at positions L-q .. L-1 (L = lens[i], q = qsl[i+1]-qsl[i])
    query p sees key t when t <= p and, with a sliding window w, t > p - w
    quantized: key t is read from the quantized block when its block is full at p (block(t) < block(p), or p is
    its block's last slot), else from the full-precision tail (`FullPrecisionTail`, the Triton kernels' rule)

Plain blocks with head_dim a multiple of 8 (no soft-capping): `cpu_decode`, the same passes in 8-lane vectors for a
decode or a short chunk; `_decode_seq` and `_chunk_seq` below for the others.
Quantized caches: `cpu_quantized` (loops per KV head over blocks dequantized as they are read). fp32 only (numba has
no half-precision arithmetic on the CPU); the caller keeps the torch path for other dtypes.
Accumulation is fp32, scores are kept per chunk in scratch rows, so a chunk of q queries needs q x heads x L floats;
each score is a dot product of its own, where a matmul shares the loads: the caller sends longer prefill chunks
(q > `MAX_KERNEL_QUERIES`, or q x L > `MAX_KERNEL_PAIRS` for plain blocks) to the torch path, where one matmul per
chunk amortises the gather.

Compiled once per install (numba's on-disk cache beside this file, `cache=True`); `warm_up()` compiles both
kernels on a tiny input so that the first real step does not pay for it.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from hf_paged.background_compile import sources_digest
from hf_paged.cache.kernels.cpu_decode import attend_seq_vectorized
from hf_paged.cache.kernels.cpu_prefetch import CPU_KERNEL_SOURCES, prefetch_lines
from hf_paged.cache.kernels.cpu_simd import softmax_row
from hf_paged.compat import seal_numba_cache

MAX_KERNEL_QUERIES = 16  # queries per sequence from which a chunk goes to the torch path (matmul)
# query x key pairs of a plain chunk above which it goes to the torch path. With `cpu_decode`'s vectors (8 sequences,
# heads 8 x 32 over 2 KV heads and 8 x 64 over 4, one thread): the kernel's time against the torch path's 0.22-0.28x
# at 2 queries, 0.48-0.62x at 4, 0.71-0.97x at 8 over 512-2,048 keys, 0.98-0.99x at 16 over 512 and 1.00-1.16x at 16
# over 2,048 (the scalar kernel had been ~1.25x at 8 over 2k, hence 8,192 before)
MAX_KERNEL_PAIRS = 16384
_FASTMATH = {"nsz", "arcp", "contract", "reassoc"}  # no "nnan"/"ninf": scores are compared, never assumed finite
@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _softmax_rows(scores, q_len, g, first, lo, hi_key, window):
    """Turn each query row's scores over its own key range into probabilities; zero the rest of the row."""
    for r in range(q_len):
        p = first + r
        start = lo if window <= 0 else max(lo, p - window + 1)
        for j in range(g):
            row = scores[r * g + j]
            m = row[start - lo]
            for t in range(start - lo + 1, p - lo + 1):
                if row[t] > m:
                    m = row[t]
            total = np.float32(0.0)
            for t in range(start - lo, p - lo + 1):
                e = np.exp(row[t] - m)
                row[t] = e
                total += e
            inv = np.float32(1.0) / total
            for t in range(hi_key - lo):
                if t < start - lo or t > p - lo:
                    row[t] = 0.0
                else:
                    row[t] *= inv


@njit(cache=True, nogil=True, inline="always")
def _rows_seeing(t, first, q_len, window):
    """The query rows r (positions first + r) that see key t: [r_lo, r_hi)."""
    r_lo = max(0, t - first)
    r_hi = q_len if window <= 0 else min(q_len, t + window - first)
    return r_lo, r_hi


@njit(cache=True, nogil=True, fastmath=_FASTMATH, inline="always")
def _score_row(q, q0, r_lo, r_hi, h, g, key, scale, softcap, scores, col):
    dim = key.shape[0]
    for r in range(r_lo, r_hi):
        for j in range(g):
            qq = q[q0 + r, h * g + j]
            dot = np.float32(0.0)
            for d in range(dim):
                dot += qq[d] * key[d]
            x = dot * scale
            if softcap > 0:
                x = np.float32(math.tanh(x / softcap)) * softcap
            scores[r * g + j, col] = x


@njit(cache=True, nogil=True, fastmath=_FASTMATH, inline="always")
def _add_value(r_lo, r_hi, g, value, scores, col, acc):
    dim = value.shape[0]
    for r in range(r_lo, r_hi):
        for j in range(g):
            p = scores[r * g + j, col]
            a = acc[r * g + j]
            for d in range(dim):
                a[d] += p * value[d]


@njit(cache=True, nogil=True)
def _scratch(q, qsl, lens, seqs, window, g):
    """Scores and accumulators: a decode's one row per query head, a plain chunk's (`_chunk_seq`) one per query
    and query head, a quantized chunk's one per query and query head of one KV head (`g` of them)."""
    rows, width = q.shape[1], 1
    for idx in range(seqs.shape[0]):
        i = seqs[idx]
        rows = max(rows, (qsl[i + 1] - qsl[i]) * q.shape[1])
        width = max(width, lens[i] if window <= 0 else min(lens[i], window + qsl[i + 1] - qsl[i]))
    return np.empty((rows, width), np.float32), np.empty((rows, q.shape[2]), np.float32)


@njit(cache=True, nogil=True)
def _write_out(out, acc, q0, q_len, h, g):
    for r in range(q_len):
        for j in range(g):
            out[q0 + r, h * g + j] = acc[r * g + j]


@njit(cache=True, nogil=True, fastmath=True)
def _decode_seq(q, q0, key_cache, value_cache, table, lo, length, scale, scores, acc, out):
    """One query (row q0, the sequence's last position) of every head: keys lo .. length - 1 (where `cpu_decode`
    does not apply), in the tightest scalar loops: each key row (all KV heads,
    contiguous in its block) is read once for every query head (GQA groups included), and each value row once;
    scores [heads, keys] and acc [heads, dim] are scratch. While a block's row r is read, row r of the next block
    (the first value block after the last key block) is prefetched: a block ahead, the memory wait overlaps the
    arithmetic (`cpu_prefetch`)."""
    bs, num_kv_heads, dim = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    heads = q.shape[1]
    g = heads // num_kv_heads
    row_bytes = num_kv_heads * dim * 4  # one token's keys (or values), every KV head: fp32, C-contiguous
    block_bytes = bs * row_bytes
    first, last = lo // bs, (length - 1) // bs
    for blk in range(first, last + 1):
        keys = key_cache[table[blk]]
        ahead = (key_cache.ctypes.data + table[blk + 1] * block_bytes if blk < last
                 else value_cache.ctypes.data + table[first] * block_bytes)
        for t in range(max(lo, blk * bs), min(length, blk * bs + bs)):
            prefetch_lines(ahead + (t - blk * bs) * row_bytes, row_bytes)
            row = keys[t - blk * bs]
            for h in range(num_kv_heads):
                k = row[h]
                for j in range(g):
                    qq = q[q0, h * g + j]
                    dot = np.float32(0.0)
                    for d in range(dim):
                        dot += qq[d] * k[d]
                    scores[h * g + j, t - lo] = dot * scale
    for r in range(heads):
        softmax_row(scores[r], length - lo)
    acc[:heads] = 0.0
    for blk in range(first, last + 1):
        values = value_cache[table[blk]]
        ahead = value_cache.ctypes.data + table[blk + 1] * block_bytes if blk < last else 0
        for t in range(max(lo, blk * bs), min(length, blk * bs + bs)):
            if ahead:
                prefetch_lines(ahead + (t - blk * bs) * row_bytes, row_bytes)
            row = values[t - blk * bs]
            for h in range(num_kv_heads):
                v = row[h]
                for j in range(g):
                    p = scores[h * g + j, t - lo]
                    a = acc[h * g + j]
                    for d in range(dim):
                        a[d] += p * v[d]
    for r in range(heads):
        out[q0, r] = acc[r]


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _plain_seq(i, q, key_cache, value_cache, tables, qsl, lens, scale, window, softcap, out, scores, acc):
    q0, q_len, length = qsl[i], qsl[i + 1] - qsl[i], lens[i]
    if q_len == 0:
        return
    first = length - q_len
    lo = 0 if window <= 0 else max(0, first - window + 1)
    if softcap <= 0 and key_cache.shape[3] % 8 == 0 and q.flags.c_contiguous and key_cache.flags.c_contiguous \
            and value_cache.flags.c_contiguous:
        attend_seq_vectorized(q, q0, q_len, key_cache, value_cache, tables[i], lo, length, window, scale, scores, acc,
                              out)
        return
    if q_len == 1 and softcap <= 0:
        _decode_seq(q, q0, key_cache, value_cache, tables[i], lo, length, scale, scores, acc, out)
        return
    _chunk_seq(q, q0, q_len, key_cache, value_cache, tables[i], lo, length, first, window, scale, softcap, scores,
               acc, out)


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _chunk_seq(q, q0, q_len, key_cache, value_cache, table, lo, length, first, window, scale, softcap, scores, acc,
               out):
    """A short chunk: queries q0 .. q0 + q_len - 1 at positions first .. length - 1, keys lo .. length - 1. As in
    `_decode_seq`, each key row and each value row (every KV head, contiguous in its block) is read once for all
    the chunk's queries and heads, in pool order (a loop per KV head read the context once per head: 1.3-2.6x
    slower over 1-2k keys); scores row r * heads + head, their softmax the vectorized `softmax_row`."""
    bs, num_kv_heads, dim = key_cache.shape[1], key_cache.shape[2], key_cache.shape[3]
    heads = q.shape[1]
    g = heads // num_kv_heads
    for t in range(lo, length):
        row = key_cache[table[t // bs], t % bs]
        r_lo, r_hi = _rows_seeing(t, first, q_len, window)
        for r in range(r_lo, r_hi):
            for h in range(num_kv_heads):
                k = row[h]
                for j in range(g):
                    qq = q[q0 + r, h * g + j]
                    dot = np.float32(0.0)
                    for d in range(dim):
                        dot += qq[d] * k[d]
                    x = dot * scale
                    if softcap > 0:
                        x = np.float32(math.tanh(x / softcap)) * softcap
                    scores[r * heads + h * g + j, t - lo] = x
    for r in range(q_len):  # query r sees keys start .. first + r (only those are read below)
        start = lo if window <= 0 else max(lo, first + r - window + 1)
        for head in range(heads):
            softmax_row(scores[r * heads + head, start - lo : first + r - lo + 1], first + r - start + 1)
    acc[: q_len * heads] = 0.0
    for t in range(lo, length):
        row = value_cache[table[t // bs], t % bs]
        r_lo, r_hi = _rows_seeing(t, first, q_len, window)
        for r in range(r_lo, r_hi):
            for h in range(num_kv_heads):
                v = row[h]
                for j in range(g):
                    p = scores[r * heads + h * g + j, t - lo]
                    a = acc[r * heads + h * g + j]
                    for d in range(dim):
                        a[d] += p * v[d]
    for r in range(q_len):
        for head in range(heads):
            out[q0 + r, head] = acc[r * heads + head]


@njit(cache=True, nogil=True)
def attend_plain(q, key_cache, value_cache, tables, qsl, lens, seqs, scale, window, softcap, out):
    """q/out [T, H, D]; caches [num_blocks, bs, Hkv, D] fp32; tables [n, max_blocks]; qsl [n + 1]; lens [n];
    seqs: the sequence indices to attend (the others' rows of `out` are left alone)."""
    scores, acc = _scratch(q, qsl, lens, seqs, window, q.shape[1] // key_cache.shape[2])
    for idx in range(seqs.shape[0]):
        _plain_seq(seqs[idx], q, key_cache, value_cache, tables, qsl, lens, scale, window, softcap, out, scores, acc)


@njit(cache=True, nogil=True, parallel=True)
def attend_plain_parallel(q, key_cache, value_cache, tables, qsl, lens, seqs, scale, window, softcap, out):
    """`attend_plain` with the sequences spread over numba's threads (each with its own scratch)."""
    for idx in prange(seqs.shape[0]):
        scores, acc = _scratch(q, qsl, lens, seqs[idx : idx + 1], window, q.shape[1] // key_cache.shape[2])
        _plain_seq(seqs[idx], q, key_cache, value_cache, tables, qsl, lens, scale, window, softcap, out, scores, acc)


seal_numba_cache(list(globals().values()), sources_digest(*CPU_KERNEL_SOURCES))  # keyed on all 7 files
