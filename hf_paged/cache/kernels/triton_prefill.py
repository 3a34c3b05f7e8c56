"""Paged prefill attention in Triton: a chunk of new query tokens per sequence against its cached pages.

The queries of all sequences are packed ([total_q_tokens, num_heads, head_dim], `query_start_loc` = cu_seqlens).
Their K/V were already stored, so a sequence's keys are exactly its pages 0 .. context_len - 1:

    key positions   0 ............. context_len - q_len | context_len - q_len ..... context_len - 1
                    cached prefix (prefix hit / earlier chunks) | this chunk (the queries sit here)

Query j of a sequence sits at position context_len - q_len + j and sees keys at positions <= its own
(and > its position - sliding_window). Grid: (query tiles, num_kv_heads). A tile holds BLOCK_Q tokens x GROUP
query heads of one KV head (GQA) as the BLOCK_M rows of one `tl.dot`, row r = (token r // GROUP, head r % GROUP).
The grid is an upper bound (total_q_tokens // BLOCK_Q + num_seqs); a program finds its sequence by binary search
over `query_start_loc` and returns at once if its tile is past the sequence's queries: no host sync.

Quantized caches: tiles are dequantized where loaded, and a second pass over the queries' own blocks reads the
full-precision tail (a query reads its own block there unless it is the block's last slot), sharing the online
softmax of the first pass.
"""

from __future__ import annotations

import math

import torch

from hf_paged.cache.kernels import launch, triton_common
from hf_paged.cache.kernels.launch import KernelLaunch, PrefillLaunchConfig
from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV, kv_operand, tail_args

__all__ = ["paged_prefill_attention_triton", "prefill_launch"]

_DEFINED = False


def _define() -> None:
    """Define the kernel as a module global on first use (see triton_common for why globals)."""
    global _DEFINED, triton, tl, load_kv_tile, attend_tile, find_seq_idx, _prefill_kernel
    if _DEFINED:
        return
    tl, load_kv_tile, attend_tile, find_seq_idx = triton_common.jit_helpers()
    triton = triton_common.import_triton()

    # Ints that change from step to step (sequences, the tables' widths) are not specialised on (Triton would
    # compile a variant for each of "== 1", "divisible by 16" and neither, mid-run, at the first step that hits one)
    @triton.jit(do_not_specialize=["stride_tt_seq", "num_seqs", "stride_bt_seq"])
    def _prefill_kernel(
        q_ptr,
        k_cache_ptr, k_scale_ptr, k_zero_ptr, stride_k_block, stride_k_slot, stride_k_head,
        stride_ks_block, stride_ks_slot, stride_ks_head,
        v_cache_ptr, v_scale_ptr, v_zero_ptr, stride_v_block, stride_v_slot, stride_v_head,
        stride_vs_block, stride_vs_slot, stride_vs_head,
        tail_k_ptr, tail_v_ptr, tail_tables_ptr,
        stride_tk_block, stride_tk_slot, stride_tk_head, stride_tv_block, stride_tv_slot, stride_tv_head,
        stride_tt_seq,
        block_tables_ptr,
        query_start_loc_ptr,
        context_lens_ptr,
        out_ptr,
        qk_scale,
        sliding_window,
        num_seqs,
        stride_q_tok,
        stride_q_head,
        stride_bt_seq,
        stride_o_tok,
        stride_o_head,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_Q: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        USE_WINDOW: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        K_FMT: tl.constexpr = 0,
        V_FMT: tl.constexpr = 0,
        K_PER_CHANNEL: tl.constexpr = False,
        V_PER_CHANNEL: tl.constexpr = False,
        HAS_TAIL: tl.constexpr = False,
    ):  # fmt: skip
        tile_idx = tl.program_id(0)
        kv_head = tl.program_id(1)
        seq = find_seq_idx(query_start_loc_ptr, tile_idx, num_seqs, BLOCK_Q)
        q_start = tl.load(query_start_loc_ptr + seq)
        q_len = tl.load(query_start_loc_ptr + seq + 1) - q_start
        local_tile = tile_idx - (q_start // BLOCK_Q + seq)
        if local_tile * BLOCK_Q >= q_len:
            return
        context_len = tl.load(context_lens_ptr + seq)
        first_q_pos = context_len - q_len + local_tile * BLOCK_Q

        rows = tl.arange(0, BLOCK_M)
        tokens = local_tile * BLOCK_Q + rows // GROUP
        heads = kv_head * GROUP + rows % GROUP
        row_mask = (rows < BLOCK_Q * GROUP) & (tokens < q_len)
        q_pos = context_len - q_len + tokens
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < HEAD_DIM
        q_mask = row_mask[:, None] & dim_mask[None, :]
        q = tl.load(
            q_ptr + (q_start + tokens)[:, None] * stride_q_tok + heads[:, None] * stride_q_head + dims[None, :],
            mask=q_mask,
            other=0.0,
        )

        # Keys this tile can see: from the window start of its first query to its last query's position.
        last_q_pos = tl.minimum(first_q_pos + BLOCK_Q, context_len) - 1
        key_lo = 0
        if USE_WINDOW:
            key_lo = tl.maximum(first_q_pos - sliding_window + 1, 0)
        k_base = k_cache_ptr + kv_head * stride_k_head
        v_base = v_cache_ptr + kv_head * stride_v_head
        ks_base, kz_base = k_scale_ptr + kv_head * stride_ks_head, k_zero_ptr + kv_head * stride_ks_head
        vs_base, vz_base = v_scale_ptr + kv_head * stride_vs_head, v_zero_ptr + kv_head * stride_vs_head
        # With a tail (quantized cache), query p reads block b quantized when b is full at p (b < p's block, or p
        # is its block's last slot), else from the tail: two passes share one online softmax.
        #   pass 1 (cache): keys key_lo .. min(last_q_pos, full_end - 1), block full at the query
        #   pass 2 (tail):  keys of the queries' own blocks, own block not full at the query
        main_end = last_q_pos + 1
        q_block = q_pos // BLOCK_SIZE
        q_fills_block = (q_pos + 1) % BLOCK_SIZE == 0
        if HAS_TAIL:
            main_end = tl.minimum(main_end, context_len // BLOCK_SIZE * BLOCK_SIZE)
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: see attend_tile
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for tile in range(key_lo // BLOCK_N, tl.cdiv(main_end, BLOCK_N)):
            positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = (positions >= key_lo) & (positions < main_end)
            block_ids = tl.load(
                block_tables_ptr + seq * stride_bt_seq + positions // BLOCK_SIZE, mask=valid, other=0
            ).to(tl.int64)
            slot_offsets = positions % BLOCK_SIZE
            k = load_kv_tile(k_base, ks_base, kz_base, block_ids, slot_offsets, dims, valid, dim_mask,
                             stride_k_block, stride_k_slot, stride_ks_block, stride_ks_slot, K_FMT, K_PER_CHANNEL)
            seen = valid[None, :] & (positions[None, :] <= q_pos[:, None])
            if USE_WINDOW:
                seen = seen & (positions[None, :] > q_pos[:, None] - sliding_window)
            if HAS_TAIL:
                seen = seen & (((positions // BLOCK_SIZE)[None, :] < q_block[:, None]) | q_fills_block[:, None])
            v = load_kv_tile(v_base, vs_base, vz_base, block_ids, slot_offsets, dims, valid, dim_mask,
                             stride_v_block, stride_v_slot, stride_vs_block, stride_vs_slot, V_FMT, V_PER_CHANNEL)
            m_i, l_i, acc = attend_tile(q, k.to(q.dtype), v.to(q.dtype), seen, m_i, l_i, acc, qk_scale,
                                        DOT_PRECISION)
        if HAS_TAIL:
            tail_lo = tl.maximum(first_q_pos // BLOCK_SIZE * BLOCK_SIZE, key_lo)
            tk_base = tail_k_ptr + kv_head * stride_tk_head
            tv_base = tail_v_ptr + kv_head * stride_tv_head
            for tile in range(tail_lo // BLOCK_N, last_q_pos // BLOCK_N + 1):
                positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
                valid = (positions >= tail_lo) & (positions <= last_q_pos)
                tail_ids = tl.load(
                    tail_tables_ptr + seq * stride_tt_seq + positions // BLOCK_SIZE, mask=valid, other=0
                ).to(tl.int64)
                slot_offsets = positions % BLOCK_SIZE
                k = load_kv_tile(tk_base, tk_base, tk_base, tail_ids, slot_offsets, dims, valid, dim_mask,
                                 stride_tk_block, stride_tk_slot, 0, 0, 0, False)
                v = load_kv_tile(tv_base, tv_base, tv_base, tail_ids, slot_offsets, dims, valid, dim_mask,
                                 stride_tv_block, stride_tv_slot, 0, 0, 0, False)
                seen = valid[None, :] & (positions[None, :] <= q_pos[:, None])
                seen = seen & ((positions // BLOCK_SIZE)[None, :] == q_block[:, None]) & ~q_fills_block[:, None]
                if USE_WINDOW:
                    seen = seen & (positions[None, :] > q_pos[:, None] - sliding_window)
                m_i, l_i, acc = attend_tile(q, k, v, seen, m_i, l_i, acc, qk_scale, DOT_PRECISION)

        out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
        tl.store(
            out_ptr + (q_start + tokens)[:, None] * stride_o_tok + heads[:, None] * stride_o_head + dims[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=q_mask,
        )

    _DEFINED = True


def paged_prefill_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail | None = None,
    config: PrefillLaunchConfig | None = None,
) -> torch.Tensor:
    """Run paged prefill attention; arguments are checked by `hf_paged.cache.kernels.paged_prefill_attention`."""
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if query.shape[0] == 0 or context_lens.shape[0] == 0:
        return out
    prefill_launch(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, out, scale=scale,
                   sliding_window=sliding_window, tail=tail, config=config).run()  # fmt: skip
    return out


def prefill_launch(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail | None = None,
    config: PrefillLaunchConfig | None = None,
) -> KernelLaunch:
    """The launch of one prefill step, not yet run."""
    _define()
    total_q, num_heads, head_dim = query.shape
    k_op, v_op = kv_operand(key_cache), kv_operand(value_cache)
    _, block_size, num_kv_heads, _ = k_op.data.shape
    num_seqs = context_lens.shape[0]
    if config is None:
        config = launch.prefill_launch_config(
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=query.dtype,
            quantized=k_op.fmt != 0 or v_op.fmt != 0,
        )
    # fmt: off
    args = (
        query, *k_op.args(), *v_op.args(), *tail_args(tail, k_op.data),
        block_tables, query_start_loc, context_lens, out,
        scale * math.log2(math.e), sliding_window or 0, num_seqs,
        query.stride(0), query.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
    )
    # fmt: on
    return KernelLaunch(
        kernel=_prefill_kernel,
        grid=(total_q // config.block_q + num_seqs, num_kv_heads),  # an upper bound of the query tiles
        args=args,
        constexprs={
            "GROUP": num_heads // num_kv_heads,
            "HEAD_DIM": head_dim,
            "BLOCK_SIZE": block_size,
            "BLOCK_M": config.block_m,
            "BLOCK_Q": config.block_q,
            "BLOCK_N": config.block_n,
            "BLOCK_D": config.block_d,
            "USE_WINDOW": sliding_window is not None,
            "DOT_PRECISION": config.dot_precision,
            "K_FMT": k_op.fmt,
            "V_FMT": v_op.fmt,
            "K_PER_CHANNEL": k_op.per_channel,
            "V_PER_CHANNEL": v_op.per_channel,
            "HAS_TAIL": tail is not None,
        },
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
