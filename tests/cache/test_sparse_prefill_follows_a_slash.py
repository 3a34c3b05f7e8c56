""""vertical_slash" finds a slash (`sparse_prefill._vertical_slash_scores`): queries that each attend to the key a
fixed distance back (320 positions: 5 key blocks) keep, in every query block, the key block that distance behind it
(the sample's slash mass at distance d goes to the block d blocks before each query block, not one more or less)."""

from __future__ import annotations

import torch

from hf_paged.cache.kernels.block_sparse import SPARSE_BLOCK
from hf_paged.cache.sparse_prefill import select_blocks

SHIFT_BLOCKS = 5


def test_each_query_block_keeps_the_block_its_queries_look_back_to():
    n, dim, shift = 1024, 64, SHIFT_BLOCKS * SPARSE_BLOCK
    g = torch.Generator().manual_seed(0)
    codes = torch.nn.functional.normalize(torch.randn(n, dim, generator=g), dim=-1)  # one direction per position
    keys = codes[:, None, :]  # [context, 1 KV head, dim]
    queries = torch.randn(n, 1, dim, generator=g) * 0.1
    queries[shift:, 0] = 12 * codes[:-shift]  # query p points at key p - 320
    selection = select_blocks(queries, keys, "vertical_slash", 0.5, scale=1.0)
    for i in range(SHIFT_BLOCKS + 2, n // SPARSE_BLOCK):  # (blocks i - 1 and i are local; 0 is the sink)
        kept = selection.blocks[0, i, : int(selection.keep[0, i])].tolist()
        assert i - SHIFT_BLOCKS in kept, (i, kept)
