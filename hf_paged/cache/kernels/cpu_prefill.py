"""Long prefill chunks over a quantized cache on the CPU: SDPA over query segments, each reading only its keys.

Every query of a chunk reads one copy of each earlier key (`reference_quantized`'s rule): the dequantized cache
copy of the blocks before its own (and of its own block when it fills it), the full-precision tail copy of its
own block otherwise. One SDPA over the whole chunk needs both copies of every key (2 x context) under an explicit
mask, and a masked SDPA skips no tile, so a fresh 1,000-token prompt costs four times its causal attention. Here
the chunk's queries are cut into segments of whole blocks; a segment reads the cache keys up to its last query's
block and the tail keys of its own blocks only, so the work approaches the causal triangle (plus one
`segment x segment` square per segment for the tail). Same outputs as
`reference_quantized.ref_paged_prefill_attention_quantized` (the test compares them).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from hf_paged.cache.kernels.quantized import FullPrecisionTail, QuantizedKV
from hf_paged.cache.kernels.reference_quantized import copy_mask, dequantize_blocks

__all__ = ["SEGMENT_TOKENS", "prefill_quantized_segments"]

SEGMENT_TOKENS = 128  # queries per SDPA call (rounded to whole blocks): fewer calls vs less wasted triangle


def prefill_quantized_segments(
    query: torch.Tensor,
    key_cache: torch.Tensor | QuantizedKV,
    value_cache: torch.Tensor | QuantizedKV,
    block_tables: torch.Tensor,
    query_start_loc: list[int],
    context_lens: list[int],
    seqs: list[int],
    *,
    scale: float,
    sliding_window: int | None,
    tail: FullPrecisionTail,
    out: torch.Tensor,
) -> None:
    """Attend the chunks of `seqs` (query rows `query_start_loc[i]:[i + 1]`) into their rows of `out`."""
    bs = tail.key.shape[1]
    heads, dim = tail.key.shape[2], tail.key.shape[3]
    seg_blocks = max(1, SEGMENT_TOKENS // bs)
    for i in seqs:
        ctx, q_start, q_end = context_lens[i], query_start_loc[i], query_start_loc[i + 1]
        first = ctx - (q_end - q_start)  # position of the chunk's first query
        n_full, tail_first = ctx // bs, first // bs
        ids = block_tables[i, :n_full].long()
        k_cache = dequantize_blocks(key_cache, ids, query.dtype).reshape(-1, heads, dim)
        v_cache = dequantize_blocks(value_cache, ids, query.dtype).reshape(-1, heads, dim)
        tail_ids = tail.block_tables[i, tail_first: -(-ctx // bs)].long()
        k_tail = tail.key.index_select(0, tail_ids).reshape(-1, heads, dim)  # from position tail_first * bs
        v_tail = tail.value.index_select(0, tail_ids).reshape(-1, heads, dim)
        for block in range(tail_first, -(-ctx // bs), seg_blocks):
            a = max(first, block * bs)  # the segment's queries: positions a .. b - 1
            b = min(ctx, (block + seg_blocks) * bs)
            cache_hi = min(n_full * bs, ((b - 1) // bs + 1) * bs)  # the last query's block, if it is full
            cache_lo = 0 if sliding_window is None else max(0, (a - sliding_window + 1) // bs * bs)
            tail_lo = block * bs - tail_first * bs  # rows of k_tail: the segment's own blocks
            tail_hi = b - tail_first * bs
            mask = copy_mask(a, b, bs, cache_lo, cache_hi, block * bs, sliding_window, query.device)
            k = torch.cat((k_cache[cache_lo:cache_hi], k_tail[tail_lo:tail_hi]))
            v = torch.cat((v_cache[cache_lo:cache_hi], v_tail[tail_lo:tail_hi]))
            rows = slice(q_start + a - first, q_start + b - first)
            q = query[rows].transpose(0, 1)[None]
            o = F.scaled_dot_product_attention(q, k.transpose(0, 1)[None], v.transpose(0, 1)[None], attn_mask=mask,
                                               scale=scale, enable_gqa=True)  # fmt: skip
            out[rows] = o[0].transpose(0, 1)

