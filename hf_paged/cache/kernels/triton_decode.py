"""Paged decode attention in Triton: one query token per sequence, split-K over its pages (flash-decoding).

Grid: (num_seqs, num_kv_heads, num_splits). A program takes every query head of one KV head (GQA: the
`num_heads // num_kv_heads` heads become the rows of one `tl.dot`, padded to 16) and one contiguous range of key
tiles of the sequence:

    positions  0 ......... start .......................... context_len - 1 | beyond: masked, never read
    tiles               [ split 0 ][ split 1 ][ split 2 ]            (BLOCK_N keys each, any block size)
    start = max(0, context_len - sliding_window), else 0

Each split keeps a running max / sum (online softmax, base 2) and writes its normalised partial output and its
log-sum-exp; `_merge_kernel` combines the splits. With one split the first kernel writes the output directly.

Quantized caches (`quantized.QuantizedKV`, format codes as constexprs): K/V tiles are dequantized where they are
loaded (`triton_common.load_kv_tile`). Only full blocks are quantized; keys from `context_len // block_size *
block_size` on (one partial block at most) are read from the full-precision tail, after the loop, by the split
that holds the sequence's last tile.
"""

from __future__ import annotations

import math

import torch

from hf_paged.cache.kernels import launch, triton_common, triton_int4
from hf_paged.cache.kernels.launch import DecodeLaunchConfig, KernelLaunch, next_power_of_2
from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV, kv_operand, tail_args

__all__ = ["decode_launches", "default_decode_config", "paged_decode_attention_triton"]

_DEFINED = False


def _define() -> None:
    """Define the kernels as module globals on first use (see triton_common for why globals)."""
    global _DEFINED, triton, tl, load_kv_tile, attend_tile, _decode_kernel, _merge_kernel
    global load_raw_tile, load_token_scales, attend_tile_folded
    if _DEFINED:
        return
    tl, load_kv_tile, attend_tile, _ = triton_common.jit_helpers()
    load_raw_tile, load_token_scales, attend_tile_folded = triton_common.folded_helpers()
    triton = triton_common.import_triton()

    # Ints that change from step to step (the tables' widths) are not specialised on (Triton would compile a
    # variant for each of "== 1", "divisible by 16" and neither, mid-run, at the first step that hits one)
    @triton.jit(do_not_specialize=["stride_tt_seq", "stride_bt_seq"])
    def _decode_kernel(
        q_ptr,
        k_cache_ptr, k_scale_ptr, k_zero_ptr, stride_k_block, stride_k_slot, stride_k_head,
        stride_ks_block, stride_ks_slot, stride_ks_head,
        v_cache_ptr, v_scale_ptr, v_zero_ptr, stride_v_block, stride_v_slot, stride_v_head,
        stride_vs_block, stride_vs_slot, stride_vs_head,
        tail_k_ptr, tail_v_ptr, tail_tables_ptr,
        stride_tk_block, stride_tk_slot, stride_tk_head, stride_tv_block, stride_tv_slot, stride_tv_head,
        stride_tt_seq,
        block_tables_ptr,
        context_lens_ptr,
        out_ptr,
        part_out_ptr,
        part_lse_ptr,
        qk_scale,
        sliding_window,
        stride_q_seq,
        stride_q_head,
        stride_bt_seq,
        stride_o_seq,
        stride_o_head,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_SIZE: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        NUM_SPLITS: tl.constexpr,
        USE_WINDOW: tl.constexpr,
        DOT_PRECISION: tl.constexpr,
        K_FMT: tl.constexpr = 0,
        V_FMT: tl.constexpr = 0,
        K_PER_CHANNEL: tl.constexpr = False,
        V_PER_CHANNEL: tl.constexpr = False,
        HAS_TAIL: tl.constexpr = False,
        FOLD_SCALES: tl.constexpr = False,
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
        dims = tl.arange(0, BLOCK_D)
        dim_mask = dims < HEAD_DIM
        q = tl.load(
            q_ptr + seq * stride_q_seq + heads[:, None] * stride_q_head + dims[None, :],
            mask=row_mask[:, None] & dim_mask[None, :],
            other=0.0,
        )

        k_base = k_cache_ptr + kv_head * stride_k_head
        v_base = v_cache_ptr + kv_head * stride_v_head
        ks_base, kz_base = k_scale_ptr + kv_head * stride_ks_head, k_zero_ptr + kv_head * stride_ks_head
        vs_base, vz_base = v_scale_ptr + kv_head * stride_vs_head, v_zero_ptr + kv_head * stride_vs_head
        # With a tail (quantized cache), keys past the last full block are still in full precision:
        #   positions 0 ........ full_end - 1 | full_end ... context_len - 1
        #             quantized cache         | tail (one partial block at most): read after the loop by the
        #                                       split that holds the last tile
        full_end = context_len
        if HAS_TAIL:
            full_end = context_len // BLOCK_SIZE * BLOCK_SIZE
        m_i = tl.full([BLOCK_G], -1.0e30, tl.float32)  # finite: see attend_tile
        l_i = tl.zeros([BLOCK_G], tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], tl.float32)
        for tile in range(tile_lo, tile_hi):
            positions = tile * BLOCK_N + tl.arange(0, BLOCK_N)
            valid = (positions >= start) & (positions < full_end)
            # Masked: table entries past the sequence's last block may be stale or -1.
            block_ids = tl.load(
                block_tables_ptr + seq * stride_bt_seq + positions // BLOCK_SIZE, mask=valid, other=0
            ).to(tl.int64)
            slot_offsets = positions % BLOCK_SIZE
            if FOLD_SCALES:  # K and V quantized per token (int8, fp8): the scales fold out of the tiles
                k = load_raw_tile(k_base, block_ids, slot_offsets, dims, valid, dim_mask, stride_k_block,
                                  stride_k_slot)
                v = load_raw_tile(v_base, block_ids, slot_offsets, dims, valid, dim_mask, stride_v_block,
                                  stride_v_slot)
                k_scales = load_token_scales(ks_base, block_ids, slot_offsets, valid, stride_ks_block,
                                             stride_ks_slot, K_FMT)
                v_scales = load_token_scales(vs_base, block_ids, slot_offsets, valid, stride_vs_block,
                                             stride_vs_slot, V_FMT)
                m_i, l_i, acc = attend_tile_folded(q, k, v, k_scales, v_scales, valid[None, :], m_i, l_i, acc,
                                                   qk_scale, DOT_PRECISION)
            else:
                k = load_kv_tile(k_base, ks_base, kz_base, block_ids, slot_offsets, dims, valid, dim_mask,
                                 stride_k_block, stride_k_slot, stride_ks_block, stride_ks_slot, K_FMT,
                                 K_PER_CHANNEL)
                v = load_kv_tile(v_base, vs_base, vz_base, block_ids, slot_offsets, dims, valid, dim_mask,
                                 stride_v_block, stride_v_slot, stride_vs_block, stride_vs_slot, V_FMT,
                                 V_PER_CHANNEL)
                m_i, l_i, acc = attend_tile(q, k.to(q.dtype), v.to(q.dtype), valid[None, :], m_i, l_i, acc,
                                            qk_scale, DOT_PRECISION)
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
                    k = load_kv_tile(tk_base, tk_base, tk_base, tail_ids, slot_offsets, dims, valid, dim_mask,
                                     stride_tk_block, stride_tk_slot, 0, 0, 0, False)
                    v = load_kv_tile(tv_base, tv_base, tv_base, tail_ids, slot_offsets, dims, valid, dim_mask,
                                     stride_tv_block, stride_tv_slot, 0, 0, 0, False)
                    m_i, l_i, acc = attend_tile(q, k, v, valid[None, :], m_i, l_i, acc, qk_scale, DOT_PRECISION)

        safe_l = tl.where(l_i > 0, l_i, 1.0)  # an empty split (or context_len 0) writes zeros, not NaN
        out = acc / safe_l[:, None]
        out_mask = row_mask[:, None] & dim_mask[None, :]
        if NUM_SPLITS == 1:
            tl.store(
                out_ptr + seq * stride_o_seq + heads[:, None] * stride_o_head + dims[None, :],
                out.to(out_ptr.dtype.element_ty),
                mask=out_mask,
            )
        else:
            # partials are contiguous [num_seqs, num_heads, NUM_SPLITS, BLOCK_D] / [..., NUM_SPLITS]
            part_row = (seq * (tl.num_programs(1) * GROUP) + heads) * NUM_SPLITS + split
            tl.store(part_out_ptr + part_row[:, None] * BLOCK_D + dims[None, :], out, mask=out_mask)
            lse = tl.where(l_i > 0, m_i + tl.log2(safe_l), float("-inf"))
            tl.store(part_lse_ptr + part_row, lse, mask=row_mask)

    @triton.jit
    def _merge_kernel(
        part_out_ptr,
        part_lse_ptr,
        out_ptr,
        stride_o_seq,
        stride_o_head,
        num_heads,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
        NUM_SPLITS: tl.constexpr,
        BLOCK_S: tl.constexpr,
    ):
        seq = tl.program_id(0)
        head = tl.program_id(1)
        splits = tl.arange(0, BLOCK_S)
        dims = tl.arange(0, BLOCK_D)
        base = (seq * num_heads + head) * NUM_SPLITS
        lse = tl.load(part_lse_ptr + base + splits, mask=splits < NUM_SPLITS, other=float("-inf"))
        lse_max = tl.max(lse, 0)
        lse_max = tl.where(lse_max == float("-inf"), 0.0, lse_max)  # every split empty: weights 0, output 0
        weights = tl.exp2(lse - lse_max)
        part = tl.load(
            part_out_ptr + (base + splits)[:, None] * BLOCK_D + dims[None, :],
            mask=(splits < NUM_SPLITS)[:, None],
            other=0.0,
        )
        total = tl.sum(weights, 0)
        out = tl.sum(part * weights[:, None], 0) / tl.where(total > 0, total, 1.0)
        tl.store(
            out_ptr + seq * stride_o_seq + head * stride_o_head + dims,
            out.to(out_ptr.dtype.element_ty),
            mask=dims < HEAD_DIM,
        )

    _DEFINED = True


def paged_decode_attention_triton(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail | None = None,
    config: DecodeLaunchConfig | None = None,
) -> torch.Tensor:
    """Run paged decode attention; arguments are checked by `hf_paged.cache.kernels.paged_decode_attention`.

    `config` overrides the heuristic `launch.decode_launch_config` (tests use it to force a number of splits).
    """
    out = torch.empty_like(query, memory_format=torch.contiguous_format)
    if query.shape[0] == 0:
        return out
    for kernel_launch in decode_launches(query, key_cache, value_cache, block_tables, context_lens, out,
                                         scale=scale, sliding_window=sliding_window, tail=tail,
                                         config=config):  # fmt: skip
        kernel_launch.run()
    return out


def decode_launches(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    out: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail | None = None,
    config: DecodeLaunchConfig | None = None,
) -> list[KernelLaunch]:
    """The launches of one decode step (the split-K kernel, then the merge when it splits), not yet run."""
    _define()
    num_seqs, num_heads, head_dim = query.shape
    k_op, v_op = kv_operand(key_cache), kv_operand(value_cache)
    _, block_size, num_kv_heads, _ = k_op.data.shape
    if config is None:
        config = default_decode_config(query, key_cache, value_cache, block_tables)
    splits = config.num_splits
    if splits > 1:
        part_out = torch.empty(num_seqs, num_heads, splits, config.block_d, dtype=torch.float32, device=query.device)
        part_lse = torch.empty(num_seqs, num_heads, splits, dtype=torch.float32, device=query.device)
    else:  # unused by the kernel when NUM_SPLITS == 1
        part_out = part_lse = out
    # fmt: off
    args = (
        query, *k_op.args(), *v_op.args(), *tail_args(tail, k_op.data),
        block_tables, context_lens, out, part_out, part_lse,
        scale * math.log2(math.e), sliding_window or 0,
        query.stride(0), query.stride(1), block_tables.stride(0), out.stride(0), out.stride(1),
    )
    # fmt: on
    split_nibbles = _split_nibbles(config, k_op, v_op, head_dim)
    main = KernelLaunch(
        kernel=triton_int4.split_nibble_kernel() if split_nibbles else _decode_kernel,
        grid=(num_seqs, num_kv_heads, splits),
        args=args,
        constexprs={
            "GROUP": num_heads // num_kv_heads,
            "HEAD_DIM": head_dim,
            "BLOCK_SIZE": block_size,
            "BLOCK_G": config.block_g,
            "BLOCK_N": config.block_n,
            "BLOCK_D": config.block_d,
            "NUM_SPLITS": splits,
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
    if not split_nibbles:  # the split-nibble kernel has no FOLD_SCALES: it folds int4 per-token scales itself
        main.constexprs["FOLD_SCALES"] = config.fold_scales and _per_token(k_op) and _per_token(v_op)
    if splits == 1:
        return [main]
    merge = KernelLaunch(
        kernel=_merge_kernel,
        grid=(num_seqs, num_heads),
        args=(part_out, part_lse, out, out.stride(0), out.stride(1), num_heads),
        constexprs={
            "HEAD_DIM": head_dim,
            "BLOCK_D": config.block_d,
            "NUM_SPLITS": splits,
            "BLOCK_S": next_power_of_2(splits),
        },
        num_warps=1 if config.block_d <= 64 else 2,
        num_stages=1,
    )
    return [main, merge]


def default_decode_config(query: torch.Tensor, key_cache: torch.Tensor | QuantizedKV,
                          value_cache: torch.Tensor | QuantizedKV, block_tables: torch.Tensor) -> DecodeLaunchConfig:
    """The launch `decode_launches` chooses when it is given none (benchmarks print and vary it)."""
    num_seqs, num_heads, head_dim = query.shape
    k_op, v_op = kv_operand(key_cache), kv_operand(value_cache)
    _, block_size, num_kv_heads, _ = k_op.data.shape
    return launch.decode_launch_config(
        num_seqs=num_seqs,
        num_heads=num_heads,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        max_context_len=block_tables.shape[1] * block_size,
        dtype=query.dtype,
        num_sms=launch.num_sms(query.device),
        # dequantized in registers; per-token formats fold their scales instead (`_per_token`), and ran
        # faster on 4 warps than on 8 on an H200 (b64 x 4k: 0.28-0.31 vs 0.33 ms; b32 x 32k: 1.11-1.18 vs 1.27)
        quantized=(k_op.fmt != 0 or v_op.fmt != 0) and not (_per_token(k_op) and _per_token(v_op)),
    )


def _per_token(op) -> bool:
    """int8 or fp8 (native conversion) with one scale per token: `triton_common.attend_tile_folded` applies."""
    return op.fmt % 8 in (1, 2) and not op.per_channel


def _split_nibbles(config: DecodeLaunchConfig, k_op, v_op, head_dim: int) -> bool:
    """K and V both int4 (any scale grouping, log8 codes too) and dots of inner dim head_dim / 2 >= 16:
    `triton_int4`'s kernel, when the config asks for it. It reads a per-channel scale pair as one word (fp16: 4
    bytes; codes: 2) and a zero pair as 2 bytes: a tensor not aligned to that keeps the joined tiles."""
    def aligned(op) -> bool:
        pair_bytes = 2 * op.scale.element_size()
        return not op.per_channel or (op.scale.data_ptr() % pair_bytes == 0 and op.zero.data_ptr() % 2 == 0)

    return (config.split_nibbles and k_op.fmt % 8 == 3 and v_op.fmt % 8 == 3 and head_dim >= 32 and aligned(k_op)
            and aligned(v_op))  # fmt: skip
