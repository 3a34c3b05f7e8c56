"""Paged decode attention over int4 K and V with the head dim split into even and odd dims (no join, no reshape).

An int4 row stores dim 2j in byte j's low nibble and dim 2j + 1 in its high nibble. `triton_common.load_kv_tile`
joins the two nibble planes back into one [BLOCK_N, BLOCK_D] tile (a layout shuffle on every tile), then
dequantizes every element in fp32. This kernel never joins: it keeps every operand split,

    q      -> q_even = q[:, 0::2], q_odd = q[:, 1::2]       (strided loads, once per program)
    packed -> lo = packed & 15 (even dims), hi = packed >> 4 (odd dims)           [BLOCK_N, BLOCK_D // 2] each
    q . k  =  q_even . k_even + q_odd . k_odd                                     two dots of inner dim D / 2
    P @ V  -> acc_even [rows, D / 2], acc_odd [rows, D / 2], stored back to the even / odd output columns

and, for a format with one scale and zero per token (`per_channel=False`: per token or per KV head), folds the
dequantization out of the tiles, so the nibbles (0..15, exact in any query dtype) go to the dots as they are:

    q . ((k_n - z_n) s_n)            = s_n (q_even . lo_n + q_odd . hi_n - z_n sum(q))
    sum_n p_n s_n (v_n - z_n)        = (p s) @ v  -  sum_n (p s)_n z_n       (the second term: one number per row)

Keys or values quantized per channel (KIVI keys) are dequantized per element, `(x - zero) * scale` with the
channel's even / odd scales, still without the join. The full-precision tail (the last partial block) is read with
even / odd strided loads. Used by `triton_decode.decode_launches` when `DecodeLaunchConfig.split_nibbles` is set,
K and V are both int4 and head_dim >= 32 (each dot's inner dim, D / 2, must be >= 16).
"""

from __future__ import annotations

from typing import Any

from hf_paged.cache.kernels import triton_common

__all__ = ["split_nibble_kernel"]

_DEFINED = False


def split_nibble_kernel() -> Any:
    """The `@triton.jit` kernel (same runtime arguments as `triton_decode._decode_kernel`), defined on first use."""
    _define()
    return _decode_split_kernel


def _define() -> None:
    """Define the kernel and its helpers as module globals (see triton_common for why globals)."""
    global _DEFINED, triton, tl, load_raw_tile, load_token_scales, load_nibbles, dequant_channel
    global _decode_split_kernel
    if _DEFINED:
        return
    tl, _, _, _ = triton_common.jit_helpers()
    load_raw_tile, load_token_scales, _ = triton_common.folded_helpers()
    triton = triton_common.import_triton()

    @triton.jit
    def load_nibbles(head_ptr, block_ids, slot_offsets, pairs, rows, pair_mask, stride_block, stride_slot):
        """The packed bytes of a tile, [BLOCK_N, BLOCK_D // 2] int32, one contiguous load per row; masked: 0."""
        offsets = (block_ids * stride_block + slot_offsets * stride_slot)[:, None] + pairs[None, :]
        return tl.load(head_ptr + offsets, mask=rows[:, None] & pair_mask[None, :], other=0).to(tl.int32)

    @triton.jit
    def dequant_channel(packed, scale_ptr, zero_ptr, block_ids, pairs, rows, pair_mask, stride_scale_block,
                        FMT: tl.constexpr):
        """(even, odd) dims of a tile quantized per channel, `(x - zero) * scale` in fp32: its scale and zero are
        [num_blocks, num_kv_heads, head_dim] (pointers offset to the head; head_dim even, so every block's row
        starts on a pair). Each pair's two scales (fp16: one 32-bit word; log8 codes: 16 bits) and two zeros (16
        bits) are one contiguous load, split like the nibbles, not two strided loads; masked reads 0."""
        mask = rows[:, None] & pair_mask[None, :]
        words = (block_ids * (stride_scale_block // 2))[:, None] + pairs[None, :]
        zeros = tl.load(zero_ptr.to(tl.pointer_type(tl.uint16)) + words, mask=mask, other=0).to(tl.int32)
        zero_even = (zeros & 255).to(tl.uint8).to(tl.int8, bitcast=True).to(tl.float32)
        zero_odd = (zeros >> 8).to(tl.uint8).to(tl.int8, bitcast=True).to(tl.float32)
        if FMT >= 8:  # uint8 log8 codes: compression.decode_log_scale
            codes = tl.load(scale_ptr.to(tl.pointer_type(tl.uint16)) + words, mask=mask, other=0).to(tl.int32)
            scale_even = tl.exp2(((codes & 255).to(tl.float32) - 160.0) * 0.1)
            scale_odd = tl.exp2(((codes >> 8).to(tl.float32) - 160.0) * 0.1)
        else:  # fp16
            halves = tl.load(scale_ptr.to(tl.pointer_type(tl.uint32)) + words, mask=mask, other=0)
            scale_even = (halves & 65535).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
            scale_odd = (halves >> 16).to(tl.uint16).to(tl.float16, bitcast=True).to(tl.float32)
        even = ((packed & 15).to(tl.float32) - zero_even) * scale_even
        odd = ((packed >> 4).to(tl.float32) - zero_odd) * scale_odd
        return even, odd

    # As `_decode_kernel`: the tables' widths are not specialised on
    @triton.jit(do_not_specialize=["stride_tt_seq", "stride_bt_seq"])
    def _decode_split_kernel(
        q_ptr,
        k_cache_ptr, k_scale_ptr, k_zero_ptr, stride_k_block, stride_k_slot, stride_k_head,
        stride_ks_block, stride_ks_slot, stride_ks_head,
        v_cache_ptr, v_scale_ptr, v_zero_ptr, stride_v_block, stride_v_slot, stride_v_head,
        stride_vs_block, stride_vs_slot, stride_vs_head,
        tail_k_ptr, tail_v_ptr, tail_tables_ptr,
        stride_tk_block, stride_tk_slot, stride_tk_head, stride_tv_block, stride_tv_slot, stride_tv_head,
        stride_tt_seq,
        block_tables_ptr, context_lens_ptr, out_ptr, part_out_ptr, part_lse_ptr,
        qk_scale, sliding_window,
        stride_q_seq, stride_q_head, stride_bt_seq, stride_o_seq, stride_o_head,
        GROUP: tl.constexpr, HEAD_DIM: tl.constexpr, BLOCK_SIZE: tl.constexpr, BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, NUM_SPLITS: tl.constexpr, USE_WINDOW: tl.constexpr,
        DOT_PRECISION: tl.constexpr, K_FMT: tl.constexpr, V_FMT: tl.constexpr, K_PER_CHANNEL: tl.constexpr,
        V_PER_CHANNEL: tl.constexpr, HAS_TAIL: tl.constexpr,
    ):  # fmt: skip
        seq = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        context_len = tl.load(context_lens_ptr + seq)
        start = 0
        if USE_WINDOW:
            start = tl.maximum(context_len - sliding_window, 0)
        first_tile = start // BLOCK_N
        num_tiles = tl.cdiv(context_len, BLOCK_N) - first_tile
        tiles_per_split = tl.cdiv(num_tiles, NUM_SPLITS)
        tile_lo = first_tile + split * tiles_per_split
        tile_hi = tl.minimum(tile_lo + tiles_per_split, first_tile + num_tiles)

        rows = tl.arange(0, BLOCK_G)
        heads = kv_head * GROUP + rows
        row_mask = rows < GROUP
        pairs = tl.arange(0, BLOCK_D // 2)  # pair j = dims 2j (low nibble) and 2j + 1 (high nibble)
        pair_mask = pairs < HEAD_DIM // 2
        q_mask = row_mask[:, None] & pair_mask[None, :]
        q_rows = q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head
        q_even = tl.load(q_rows + (2 * pairs)[None, :], mask=q_mask, other=0.0)
        q_odd = tl.load(q_rows + (2 * pairs + 1)[None, :], mask=q_mask, other=0.0)
        # sum(q) of the values the dots see (the query dtype's), for the keys' zero points
        q_sum = tl.sum(q_even.to(tl.float32) + q_odd.to(tl.float32), 1)

        k_base = k_cache_ptr + kv_head * stride_k_head
        v_base = v_cache_ptr + kv_head * stride_v_head
        ks_base, kz_base = k_scale_ptr + kv_head * stride_ks_head, k_zero_ptr + kv_head * stride_ks_head
        vs_base, vz_base = v_scale_ptr + kv_head * stride_vs_head, v_zero_ptr + kv_head * stride_vs_head
        full_end = context_len  # positions from full_end on are in the tail (see _decode_kernel)
        if HAS_TAIL:
            full_end = context_len // BLOCK_SIZE * BLOCK_SIZE
        m_i = tl.full([BLOCK_G], -1.0e30, tl.float32)  # finite: see attend_tile
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc_even = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)
        acc_odd = tl.zeros([BLOCK_G, BLOCK_D // 2], tl.float32)
        v_zero_sum = tl.zeros([BLOCK_G], tl.float32)  # sum_n (p s_v)[n] z_v[n], subtracted from every dim at the end
        for tile in range(tile_lo, tile_hi):
            positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = (positions >= start) & (positions < full_end)
            block_ids = tl.load(  # masked: entries past the sequence's last block may be stale or -1
                block_tables_ptr + seq * stride_bt_seq + positions // BLOCK_SIZE, mask=valid, other=0
            ).to(tl.int64)
            slot_offsets = positions % BLOCK_SIZE
            packed = load_nibbles(k_base, block_ids, slot_offsets, pairs, valid, pair_mask, stride_k_block,
                                  stride_k_slot)
            if K_PER_CHANNEL:
                k_even, k_odd = dequant_channel(packed, ks_base, kz_base, block_ids, pairs, valid, pair_mask,
                                                stride_ks_block, K_FMT)
                k_even, k_odd = k_even.to(q_even.dtype), k_odd.to(q_even.dtype)
                scores = tl.dot(q_even, tl.trans(k_even), input_precision=DOT_PRECISION)
                scores += tl.dot(q_odd, tl.trans(k_odd), input_precision=DOT_PRECISION)
                scores = scores * qk_scale
            else:
                k_scales = load_token_scales(ks_base, block_ids, slot_offsets, valid, stride_ks_block, stride_ks_slot,
                                             K_FMT)
                k_zeros = load_token_scales(kz_base, block_ids, slot_offsets, valid, stride_ks_block, stride_ks_slot,
                                            0)
                scores = tl.dot(q_even, tl.trans((packed & 15).to(q_even.dtype)), input_precision=DOT_PRECISION)
                scores += tl.dot(q_odd, tl.trans((packed >> 4).to(q_even.dtype)), input_precision=DOT_PRECISION)
                scores = (scores - q_sum[:, None] * k_zeros[None, :]) * (k_scales * qk_scale)[None, :]
            scores = tl.where(valid[None, :], scores, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(scores, 1))
            alpha = tl.exp2(m_i - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_i = l_i * alpha + tl.sum(p, 1)
            m_i = m_new
            packed = load_nibbles(v_base, block_ids, slot_offsets, pairs, valid, pair_mask, stride_v_block,
                                  stride_v_slot)
            if V_PER_CHANNEL:
                v_even, v_odd = dequant_channel(packed, vs_base, vz_base, block_ids, pairs, valid, pair_mask,
                                                stride_vs_block, V_FMT)
                v_even, v_odd = v_even.to(q_even.dtype), v_odd.to(q_even.dtype)
                weights = p.to(q_even.dtype)
            else:
                v_scales = load_token_scales(vs_base, block_ids, slot_offsets, valid, stride_vs_block, stride_vs_slot,
                                             V_FMT)
                v_zeros = load_token_scales(vz_base, block_ids, slot_offsets, valid, stride_vs_block, stride_vs_slot,
                                            0)
                v_even = (packed & 15).to(q_even.dtype)
                v_odd = (packed >> 4).to(q_even.dtype)
                weights = (p * v_scales[None, :]).to(q_even.dtype)
                # the rounded weights, as the dots get them: the correction cancels their zero points exactly
                v_zero_sum = v_zero_sum * alpha + tl.sum(weights.to(tl.float32) * v_zeros[None, :], 1)
            acc_even = acc_even * alpha[:, None] + tl.dot(weights, v_even, input_precision=DOT_PRECISION)
            acc_odd = acc_odd * alpha[:, None] + tl.dot(weights, v_odd, input_precision=DOT_PRECISION)
        if HAS_TAIL:
            last_tile = tl.cdiv(context_len, BLOCK_N) - 1
            if (tile_lo <= last_tile) & (last_tile < tile_hi):
                tail_lo = tl.maximum(full_end, start)
                tk_base = tail_k_ptr + kv_head * stride_tk_head
                tv_base = tail_v_ptr + kv_head * stride_tv_head
                for tile in range(tail_lo // BLOCK_N, last_tile + 1):
                    positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
                    valid = (positions >= tail_lo) & (positions < context_len)
                    tail_ids = tl.load(
                        tail_tables_ptr + seq * stride_tt_seq + positions // BLOCK_SIZE, mask=valid, other=0
                    ).to(tl.int64)
                    slot_offsets = positions % BLOCK_SIZE
                    k_even = load_raw_tile(tk_base, tail_ids, slot_offsets, 2 * pairs, valid, pair_mask,
                                           stride_tk_block, stride_tk_slot)
                    k_odd = load_raw_tile(tk_base, tail_ids, slot_offsets, 2 * pairs + 1, valid, pair_mask,
                                          stride_tk_block, stride_tk_slot)
                    scores = tl.dot(q_even, tl.trans(k_even), input_precision=DOT_PRECISION)
                    scores += tl.dot(q_odd, tl.trans(k_odd), input_precision=DOT_PRECISION)
                    scores = tl.where(valid[None, :], scores * qk_scale, float("-inf"))
                    m_new = tl.maximum(m_i, tl.max(scores, 1))
                    alpha = tl.exp2(m_i - m_new)
                    p = tl.exp2(scores - m_new[:, None])
                    l_i = l_i * alpha + tl.sum(p, 1)
                    m_i = m_new
                    v_even = load_raw_tile(tv_base, tail_ids, slot_offsets, 2 * pairs, valid, pair_mask,
                                           stride_tv_block, stride_tv_slot)
                    v_odd = load_raw_tile(tv_base, tail_ids, slot_offsets, 2 * pairs + 1, valid, pair_mask,
                                          stride_tv_block, stride_tv_slot)
                    weights = p.to(q_even.dtype)
                    v_zero_sum = v_zero_sum * alpha
                    acc_even = acc_even * alpha[:, None] + tl.dot(weights, v_even, input_precision=DOT_PRECISION)
                    acc_odd = acc_odd * alpha[:, None] + tl.dot(weights, v_odd, input_precision=DOT_PRECISION)

        safe_l = tl.where(l_i > 0, l_i, 1.0)  # an empty split (or context_len 0) writes zeros, not NaN
        out_even = (acc_even - v_zero_sum[:, None]) / safe_l[:, None]
        out_odd = (acc_odd - v_zero_sum[:, None]) / safe_l[:, None]
        if NUM_SPLITS == 1:
            out_rows = out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head
            tl.store(out_rows + (2 * pairs)[None, :], out_even.to(out_ptr.dtype.element_ty), mask=q_mask)
            tl.store(out_rows + (2 * pairs + 1)[None, :], out_odd.to(out_ptr.dtype.element_ty), mask=q_mask)
        else:
            # the partial layout of _decode_kernel (merged by its _merge_kernel): [num_seqs, num_heads, NUM_SPLITS,
            # BLOCK_D] / [..., NUM_SPLITS], the even and odd dims written to their own columns
            part_row = (seq * (tl.num_programs(1) * GROUP) + heads) * NUM_SPLITS + split
            part_rows = part_out_ptr + part_row[:, None] * BLOCK_D
            tl.store(part_rows + (2 * pairs)[None, :], out_even, mask=q_mask)
            tl.store(part_rows + (2 * pairs + 1)[None, :], out_odd, mask=q_mask)
            lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
            tl.store(part_lse_ptr + part_row, lse, mask=row_mask)

    _DEFINED = True
