"""Causal prefill chunks in blocks of query rows on the CPU: one SDPA call per block, over the keys its rows see.

torch's CPU flash attention skips no key inside its 512-key blocks for a causal chunk below 512 queries, and a chunk
after a cached prefix (a mask) computes every (query, key) pair: one call per block of rows leaves ~q x 32 masked
pairs (10-30% less time at 126-512 queries, `benchmarks/throughput_causal_ab.py`). A chunk with no prefix past 1,024
queries runs torch's causal kernel whole: it skips key blocks there (2,048 queries, one thread, 8 heads of 32:
40.7 ms whole, 46.8 ms in rows of 64; 1,024: 11.9 whole, 11.1 in rows).

    rows start .. end - 1 at positions P + start .. P + end - 1   (P = context_len - q_len)
    keys  0 ............ P + start - 1 | P + start ...... P + end - 1
          every row sees them (mask 0)  | the block's own triangle (-inf above the diagonal)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

CAUSAL_ROW_BLOCK = 64  # query rows per SDPA call (0: one call per chunk)
CAUSAL_ROWS_MAX_PLAIN = 1024  # most queries of a chunk with no cached prefix that still runs in rows


@dataclass(slots=True)
class CausalRows:
    """A block of a causal chunk's query rows, attended over the keys they can see only."""

    start: int  # first row within the chunk
    end: int  # one past its last row
    num_keys: int  # keys 0 .. num_keys - 1 (the last row's position + 1)
    mask: torch.Tensor | None  # [end - start, num_keys] additive (0 / -inf) in the query's dtype; None: one row


def pays(q_len: int, after_prefix: bool) -> bool:
    """Whether a causal chunk of `q_len` queries runs in row blocks: longer than one block, and after a cached
    prefix or not past `CAUSAL_ROWS_MAX_PLAIN`."""
    return q_len > CAUSAL_ROW_BLOCK > 0 and (after_prefix or q_len <= CAUSAL_ROWS_MAX_PLAIN)


def causal_rows(q_len: int, context_len: int, dtype: torch.dtype, device: torch.device) -> list[CausalRows]:
    """The row blocks of a causal chunk (its queries are the context's last `q_len` positions)."""
    prefix, blocks = context_len - q_len, []
    for start in range(0, q_len, CAUSAL_ROW_BLOCK):
        end = min(q_len, start + CAUSAL_ROW_BLOCK)
        mask = None
        if end - start > 1:
            mask = torch.zeros(end - start, prefix + end, dtype=dtype, device=device)
            mask[:, prefix + start :].masked_fill_(
                torch.ones(end - start, end - start, dtype=torch.bool, device=device).triu(1), float("-inf"))
        blocks.append(CausalRows(start, end, prefix + end, mask))
    return blocks
