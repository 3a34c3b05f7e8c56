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
"""

from __future__ import annotations

import math

import torch

from hf_paged.cache.kernels import launch, triton_common
from hf_paged.cache.kernels.launch import KernelLaunch, PrefillLaunchConfig

__all__ = ["paged_prefill_attention_triton", "prefill_launch"]

_DEFINED = False


def _define() -> None:
    """Define the kernel as a module global on first use (see triton_common for why globals)."""
    global _DEFINED, triton, tl, load_kv_tile, attend_tile, find_seq_idx, _prefill_kernel
    if _DEFINED:
        return
    tl, load_kv_tile, attend_tile, find_seq_idx = triton_common.jit_helpers()
    triton = triton_common.import_triton()

    @triton.jit
    def _prefill_kernel(
        q_ptr,
        k_cache_ptr,
        v_cache_ptr,
        block_tables_ptr,
        query_start_loc_ptr,
        context_lens_ptr,
        out_ptr,
        qk_scale,
        sliding_window,
        num_seqs,
        stride_q_tok,
        stride_q_head,
        stride_k_block,
        stride_k_slot,
        stride_k_head,
        stride_v_block,
        stride_v_slot,
        stride_v_head,
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
    ):
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
        m_i = tl.full([BLOCK_M], -1.0e30, tl.float32)  # finite: see attend_tile
        l_i = tl.zeros([BLOCK_M], tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
        for tile in range(key_lo // BLOCK_N, last_q_pos // BLOCK_N + 1):
            positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = (positions >= key_lo) & (positions <= last_q_pos)
            block_ids = tl.load(
                block_tables_ptr + seq * stride_bt_seq + positions // BLOCK_SIZE, mask=valid, other=0
            ).to(tl.int64)
            slot_offsets = positions % BLOCK_SIZE
            kv_mask = valid[:, None] & dim_mask[None, :]
            k = load_kv_tile(k_base, block_ids, slot_offsets, dims, kv_mask, stride_k_block, stride_k_slot)
            seen = valid[None, :] & (positions[None, :] <= q_pos[:, None])
            if USE_WINDOW:
                seen = seen & (positions[None, :] > q_pos[:, None] - sliding_window)
            v = load_kv_tile(v_base, block_ids, slot_offsets, dims, kv_mask, stride_v_block, stride_v_slot)
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
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    config: PrefillLaunchConfig | None = None,
) -> torch.Tensor:
    """Run paged prefill attention; arguments are checked by `hf_paged.cache.kernels.paged_prefill_attention`."""
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if query.shape[0] == 0 or context_lens.shape[0] == 0:
        return out
    prefill_launch(query, key_cache, value_cache, block_tables, query_start_loc, context_lens, out, scale=scale,
                   sliding_window=sliding_window, config=config).run()  # fmt: skip
    return out


def prefill_launch(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    config: PrefillLaunchConfig | None = None,
) -> KernelLaunch:
    """The launch of one prefill step, not yet run."""
    _define()
    total_q, num_heads, head_dim = query.shape
    _, block_size, num_kv_heads, _ = key_cache.shape
    num_seqs = context_lens.shape[0]
    if config is None:
        config = launch.prefill_launch_config(
            num_heads=num_heads, num_kv_heads=num_kv_heads, head_dim=head_dim, dtype=query.dtype
        )
    # fmt: off
    args = (
        query, key_cache, value_cache, block_tables, query_start_loc, context_lens, out,
        scale * math.log2(math.e), sliding_window or 0, num_seqs,
        query.stride(0), query.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        value_cache.stride(0), value_cache.stride(1), value_cache.stride(2),
        block_tables.stride(0), out.stride(0), out.stride(1),
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
        },
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
