"""Torch reference of the quantized paged kernels: dequantize the gathered blocks, then plain SDPA.

The yardstick of the fused-dequant Triton kernels (and their CPU path under `backend="torch"`). One sequence at a
time, for clarity rather than speed; the engine's torch path has its own batched plan (`compression.blocks`).

    sequence i, context_len c, q_len q, block size bs; query p = c - q + j
    cache keys  0 .............. full_end - 1        full_end = c // bs * bs (only full blocks are quantized)
    tail keys         (p0 // bs) * bs ......... c - 1   the chunk's own blocks, p0 = c - q
    query p sees a cache key k <= p when block(k) < block(p) or p is its block's last slot, else the tail key k
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_paged.cache.compression.formats import BlockFormat
from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV

__all__ = ["copy_mask", "dequantize_blocks", "ref_paged_decode_attention_quantized",
           "ref_paged_prefill_attention_quantized"]


def dequantize_blocks(cache: torch.Tensor | QuantizedKV, block_ids: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Blocks `block_ids` of a cache as `[n, block_size, num_kv_heads, head_dim]` in `dtype`."""
    if isinstance(cache, torch.Tensor):
        return cache.index_select(0, block_ids).to(dtype)
    data = cache.data.view(torch.float8_e4m3fn) if cache.format == "fp8" else cache.data  # fp8 may come as bytes
    parts = {"data": data.index_select(0, block_ids), "scale": cache.scale.index_select(0, block_ids)}
    if cache.zero is not None:
        parts["zero"] = cache.zero.index_select(0, block_ids)
    fmt = BlockFormat(cache.format, per_channel=cache.per_channel, per_head=cache.per_head,
                      log_scale=cache.scale.dtype == torch.uint8)
    return fmt.dequantize(parts, dtype)


def ref_paged_prefill_attention_quantized(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    query_start_loc: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail,
    seqs: list[int] | None = None,
    out: torch.Tensor | None = None,
) -> torch.Tensor:
    """Same contract as `paged_prefill_attention` with a tail (see the module docstring). With `seqs`, only those
    sequences are attended, into their rows of `out`."""
    bs = tail.key.shape[1]
    out = torch.empty_like(query) if out is None else out
    qsl, lens = query_start_loc.tolist(), context_lens.tolist()
    for i in range(len(lens)) if seqs is None else seqs:
        ctx, q_start, q_end = lens[i], qsl[i], qsl[i + 1]
        if q_end == q_start:
            continue
        n_full = ctx // bs
        tail_first = (ctx - (q_end - q_start)) // bs
        ids = block_tables[i, :n_full].long()
        tail_ids = tail.block_tables[i, tail_first : -(-ctx // bs)].long()
        heads, dim = tail.key.shape[2], tail.key.shape[3]
        k = torch.cat((dequantize_blocks(key_cache, ids, query.dtype).reshape(-1, heads, dim),
                       tail.key.index_select(0, tail_ids).reshape(-1, heads, dim)[: ctx - tail_first * bs]))
        v = torch.cat((dequantize_blocks(value_cache, ids, query.dtype).reshape(-1, heads, dim),
                       tail.value.index_select(0, tail_ids).reshape(-1, heads, dim)[: ctx - tail_first * bs]))
        mask = _read_mask(ctx, q_end - q_start, bs, sliding_window, query.device)
        q = query[q_start:q_end].transpose(0, 1)[None]
        o = F.scaled_dot_product_attention(q, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask,
                                           scale=scale, enable_gqa=True)  # fmt: skip
        out[q_start:q_end] = o[0].transpose(0, 1)
    return out


def _read_mask(ctx: int, q_len: int, bs: int, sliding_window: int | None, device) -> torch.Tensor:
    """[q_len, cache keys + tail keys] bool: which copy of each key each query reads."""
    return copy_mask(ctx - q_len, ctx, bs, 0, ctx // bs * bs, (ctx - q_len) // bs * bs, sliding_window, device)


def copy_mask(first: int, end: int, bs: int, cache_lo: int, cache_hi: int, tail_lo: int, sliding_window: int | None,
              device) -> torch.Tensor:
    """[end - first, cache keys + tail keys] bool for the queries at positions first .. end - 1, against cache keys
    at positions cache_lo .. cache_hi - 1 and tail keys at tail_lo .. end - 1: which copy of a key each reads."""
    q = torch.arange(first, end, device=device)[:, None]
    q_fills_block = (q + 1) % bs == 0
    cache_keys = torch.arange(cache_lo, cache_hi, device=device)[None, :]
    tail_keys = torch.arange(tail_lo, end, device=device)[None, :]
    from_cache = (cache_keys <= q) & ((cache_keys // bs < q // bs) | q_fills_block)
    from_tail = (tail_keys <= q) & (tail_keys // bs == q // bs) & ~q_fills_block
    if sliding_window is not None:
        from_cache &= cache_keys > q - sliding_window
        from_tail &= tail_keys > q - sliding_window
    return torch.cat((from_cache, from_tail), dim=1)


def ref_paged_decode_attention_quantized(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    context_lens: torch.Tensor,
    *,
    scale: float,
    sliding_window: int | None = None,
    tail: FullPrecisionTail,
) -> torch.Tensor:
    """Same contract as `paged_decode_attention` with a tail: one query per sequence, at context_len - 1."""
    query_start_loc = torch.arange(query.shape[0] + 1, dtype=torch.int32)
    return ref_paged_prefill_attention_quantized(query, key_cache, value_cache, block_tables, query_start_loc,
                                                 context_lens, scale=scale, sliding_window=sliding_window, tail=tail)
