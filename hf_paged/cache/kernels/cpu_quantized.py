"""The CPU paged-attention kernels over quantized caches (`cpu_attention`'s loops, blocks dequantized as read).

    format  data (per block row)     scale                                   value
    int8    int8 [D]                 per token, or per (token, KV head)      q * scale    (scale out of the dot)
    fp8     e4m3 bytes [D]           per token, or per (token, KV head)      table[q] * scale
    int4    uint8 [D/2], even low    per token / head, or per (head, dim)    (q - zero) * scale
    scales are fp16 (read as int16 bits) or log8 codes (uint8, 2^((c - 160) / 10)); see `cache.compression`

A block is quantized once full; a query reads the block still being written from the full-precision tail
(`FullPrecisionTail`), the Triton kernels' rule (`_first_full_reader`). Decode rows dequantize each block once for
all the query heads of a KV head; int8 blocks are not dequantized at all (the per-token scale multiplies the dot
product and the softmax weight).
"""

from __future__ import annotations

import numpy as np
from numba import njit, prange

from hf_paged.background_compile import sources_digest
from hf_paged.cache.kernels.cpu_attention import (
    _FASTMATH,
    _add_value,
    _rows_seeing,
    _score_row,
    _scratch,
    _softmax_rows,
    _write_out,
)
from hf_paged.cache.kernels.cpu_dequant import (  # noqa: F401 -- (the codes and tables, as this module's too)
    FP8,
    FP8_VALUES,
    INT4,
    INT8,
    LOG_SCALES,
    PER_CHANNEL,
    PER_HEAD,
    PER_TOKEN,
    PLAIN,
    _copy_block,
    _dequant_block,
    _dequant_row,
    _half,
    _scale,
)
from hf_paged.cache.kernels.cpu_prefetch import CPU_KERNEL_SOURCES
from hf_paged.cache.kernels.cpu_quantized_decode import decode_head_vectorized, vector_decode_applies
from hf_paged.cache.kernels.cpu_simd import softmax_row
from hf_paged.compat import seal_numba_cache


@njit(cache=True, nogil=True, fastmath=True)
def _decode_head_quantized(q, q0, h, g, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero, v_fmt,
                           v_layout, log_scale, tail_k, tail_v, tail_table, table, lo, length, scale, scores, acc,
                           out, block, channel):
    """One KV head's decode over quantized blocks: each block is dequantized once into `block` [bs, D] (K, then V) and
    read by all g query heads; the last block comes from the tail unless the query fills it."""
    bs, dim = tail_k.shape[1], tail_k.shape[3]
    open_block = (length - 1) // bs if length % bs else -1  # the block not yet quantized
    for blk in range(lo // bs, (length + bs - 1) // bs):
        t0, t1 = max(lo, blk * bs), min(length, blk * bs + bs)
        if blk != open_block and k_fmt == INT8 and k_layout != PER_CHANNEL:  # the scale factors out of the dot
            b = table[blk]
            for j in range(g):
                qq = q[q0, h * g + j]
                for t in range(t0, t1):
                    raw = k_data[b, t - blk * bs, h]
                    dot = np.float32(0.0)
                    for d in range(dim):
                        dot += qq[d] * np.float32(raw[d])
                    scores[j, t - lo] = dot * scale * _scale(k_scale, log_scale, b, t - blk * bs, h, 0, k_layout)
            continue
        if blk != open_block and k_fmt == INT4 and k_layout == PER_CHANNEL:  # (q * scale) . (nibbles - zero)
            _int4_channel_scores(q, q0, h, g, k_data, k_scale, k_zero, log_scale, table[blk], blk * bs, t0, t1, lo,
                                 scale, scores, channel, block[0])
            continue
        if blk == open_block:
            keys = tail_k[tail_table[blk], :, h]
        elif k_fmt == PLAIN:  # a full-precision part beside a quantized one
            _copy_block(k_data, table[blk], h, t1 - blk * bs, block)
            keys = block
        else:
            _dequant_block(k_data, k_scale, k_zero, k_fmt, k_layout, log_scale, table[blk], h, t1 - blk * bs,
                           channel, block)
            keys = block
        for j in range(g):
            qq = q[q0, h * g + j]
            for t in range(t0, t1):
                k = keys[t - blk * bs]
                dot = np.float32(0.0)
                for d in range(dim):
                    dot += qq[d] * k[d]
                scores[j, t - lo] = dot * scale
    for j in range(g):
        softmax_row(scores[j], length - lo)
    acc[:g] = 0.0
    shift = np.zeros(g, np.float32)  # int4 values: sum of weight * zero point, taken off every dim at the end
    for blk in range(lo // bs, (length + bs - 1) // bs):
        t0, t1 = max(lo, blk * bs), min(length, blk * bs + bs)
        if blk != open_block and v_fmt == INT4 and v_layout != PER_CHANNEL:
            b = table[blk]
            for t in range(t0, t1):
                o = t - blk * bs
                raw = v_data[b, o, h]
                sv = _scale(v_scale, log_scale, b, o, h, 0, v_layout)
                z = np.float32(v_zero[b, o, 0] if v_layout == PER_TOKEN else v_zero[b, o, h])
                for j in range(g):
                    w = scores[j, t - lo] * sv
                    shift[j] += w * z
                    a = acc[j]
                    for e in range(dim // 2):
                        byte = np.int32(raw[e]) & 0xFF
                        a[2 * e] += w * np.float32(byte & 0xF)
                        a[2 * e + 1] += w * np.float32(byte >> 4)
            continue
        if blk != open_block and v_fmt == INT8 and v_layout != PER_CHANNEL:  # the scale goes into the weight
            b = table[blk]
            for t in range(t0, t1):
                raw = v_data[b, t - blk * bs, h]
                sv = _scale(v_scale, log_scale, b, t - blk * bs, h, 0, v_layout)
                for j in range(g):
                    w = scores[j, t - lo] * sv
                    a = acc[j]
                    for d in range(dim):
                        a[d] += w * np.float32(raw[d])
            continue
        if blk == open_block:
            values = tail_v[tail_table[blk], :, h]
        elif v_fmt == PLAIN:  # a full-precision part beside a quantized one
            _copy_block(v_data, table[blk], h, t1 - blk * bs, block)
            values = block
        else:
            _dequant_block(v_data, v_scale, v_zero, v_fmt, v_layout, log_scale, table[blk], h, t1 - blk * bs,
                           channel, block)
            values = block
        for t in range(t0, t1):
            v = values[t - blk * bs]
            for j in range(g):
                p = scores[j, t - lo]
                a = acc[j]
                for d in range(dim):
                    a[d] += p * v[d]
    for j in range(g):
        out[q0, h * g + j] = acc[j] - shift[j]


@njit(cache=True, nogil=True, fastmath=True)
def _int4_channel_scores(q, q0, h, g, k_data, k_scale, k_zero, log_scale, b, first, t0, t1, lo, scale, scores,
                         channel, scaled_q):
    """Scores of int4 keys with a scale and zero per dim (KIVI): q . ((n - z) * s) = (q * s) . n - (q * s) . z."""
    dim = channel.shape[1]
    for d in range(dim):
        channel[0, d] = _scale(k_scale, log_scale, b, 0, h, d, PER_CHANNEL)
        channel[1, d] = np.float32(k_zero[b, h, d])
    for j in range(g):
        qq = q[q0, h * g + j]
        offset = np.float32(0.0)
        for d in range(dim):
            scaled_q[d] = qq[d] * channel[0, d]
            offset += scaled_q[d] * channel[1, d]
        for t in range(t0, t1):
            raw = k_data[b, t - first, h]
            dot = np.float32(0.0)
            for e in range(dim // 2):
                byte = np.int32(raw[e]) & 0xFF
                dot += scaled_q[2 * e] * np.float32(byte & 0xF) + scaled_q[2 * e + 1] * np.float32(byte >> 4)
            scores[j, t - lo] = (dot - offset) * scale


@njit(cache=True, nogil=True, fastmath=_FASTMATH)
def _quantized_seq(i, q, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero, v_fmt, v_layout,
                   log_scale, tail_k, tail_v, tail_tables, tables, qsl, lens, scale, window, softcap, out, scores,
                   acc):
    bs, num_kv_heads, dim = tail_k.shape[1], tail_k.shape[2], tail_k.shape[3]
    g = q.shape[1] // num_kv_heads
    row = np.empty(dim, np.float32)
    block, channel = np.empty((bs, dim), np.float32), np.empty((2, dim), np.float32)
    q0, q_len, length = qsl[i], qsl[i + 1] - qsl[i], lens[i]
    if q_len == 0:
        return
    first = length - q_len
    lo = 0 if window <= 0 else max(0, first - window + 1)
    if q_len == 1 and softcap <= 0 and vector_decode_applies(q, tail_k, tail_v, k_fmt, v_fmt):
        for h in range(num_kv_heads):
            decode_head_vectorized(q, q0, h, g, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero,
                                   v_fmt, v_layout, log_scale, tail_k, tail_v, tail_tables[i], tables[i], lo, length,
                                   scale, scores, acc, out, block, channel)
        return
    if q_len == 1 and softcap <= 0:
        for h in range(num_kv_heads):
            _decode_head_quantized(q, q0, h, g, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale,
                                   v_zero, v_fmt, v_layout, log_scale, tail_k, tail_v, tail_tables[i], tables[i],
                                   lo, length, scale, scores, acc, out, block, channel)
        return
    for h in range(num_kv_heads):
        for t in range(lo, length):
            r_lo, r_hi = _rows_seeing(t, first, q_len, window)
            split = _first_full_reader(t, first, q_len, bs, r_lo, r_hi)  # rows >= split read the cache
            if split > r_lo:
                _score_row(q, q0, r_lo, split, h, g, tail_k[tail_tables[i, t // bs], t % bs, h], scale,
                           softcap, scores, t - lo)
            if split < r_hi:
                b = tables[i, t // bs]
                if k_fmt == PLAIN:
                    _score_row(q, q0, split, r_hi, h, g, k_data[b, t % bs, h], scale, softcap, scores, t - lo)
                else:
                    _dequant_row(k_data, k_scale, k_zero, k_fmt, k_layout, log_scale, b, t % bs, h, row)
                    _score_row(q, q0, split, r_hi, h, g, row, scale, softcap, scores, t - lo)
        _softmax_rows(scores, q_len, g, first, lo, length, window)
        acc[: q_len * g] = 0.0
        for t in range(lo, length):
            r_lo, r_hi = _rows_seeing(t, first, q_len, window)
            split = _first_full_reader(t, first, q_len, bs, r_lo, r_hi)
            if split > r_lo:
                _add_value(r_lo, split, g, tail_v[tail_tables[i, t // bs], t % bs, h], scores, t - lo, acc)
            if split < r_hi:
                b = tables[i, t // bs]
                if v_fmt == PLAIN:
                    _add_value(split, r_hi, g, v_data[b, t % bs, h], scores, t - lo, acc)
                else:
                    _dequant_row(v_data, v_scale, v_zero, v_fmt, v_layout, log_scale, b, t % bs, h, row)
                    _add_value(split, r_hi, g, row, scores, t - lo, acc)
        _write_out(out, acc, q0, q_len, h, g)


@njit(cache=True, nogil=True)
def attend_quantized(q, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero, v_fmt, v_layout,
                     log_scale, tail_k, tail_v, tail_tables, tables, qsl, lens, seqs, scale, window, softcap, out):
    """`attend_plain` over a quantized cache (`_dequant_row`'s formats, fmt PLAIN for a full-precision part) and
    its full-precision tail [num_tail_blocks, bs, Hkv, D] (`tail_tables` [n, max_blocks])."""
    scores, acc = _scratch(q, qsl, lens, seqs, window, q.shape[1] // tail_k.shape[2])
    for idx in range(seqs.shape[0]):
        _quantized_seq(seqs[idx], q, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero, v_fmt,
                       v_layout, log_scale, tail_k, tail_v, tail_tables, tables, qsl, lens, scale, window, softcap,
                       out, scores, acc)


@njit(cache=True, nogil=True, parallel=True)
def attend_quantized_parallel(q, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero, v_fmt,
                              v_layout, log_scale, tail_k, tail_v, tail_tables, tables, qsl, lens, seqs, scale,
                              window, softcap, out):
    """`attend_quantized` with the sequences spread over numba's threads."""
    for idx in prange(seqs.shape[0]):
        scores, acc = _scratch(q, qsl, lens, seqs[idx : idx + 1], window, q.shape[1] // tail_k.shape[2])
        _quantized_seq(seqs[idx], q, k_data, k_scale, k_zero, k_fmt, k_layout, v_data, v_scale, v_zero, v_fmt,
                       v_layout, log_scale, tail_k, tail_v, tail_tables, tables, qsl, lens, scale, window, softcap,
                       out, scores, acc)


@njit(cache=True, nogil=True, inline="always")
def _first_full_reader(t, first, q_len, bs, r_lo, r_hi):
    """Among rows [r_lo, r_hi) (ascending positions), the first whose position p has key t's block full:
    block(t) < block(p), or p is the last slot of t's block. Rows before it read t from the tail."""
    block_end = (t // bs + 1) * bs - 1  # the last slot of t's block: a query there sees the block full
    return min(max(r_lo, block_end - first), r_hi)


seal_numba_cache(list(globals().values()), sources_digest(*CPU_KERNEL_SOURCES))  # keyed on all 7 files
