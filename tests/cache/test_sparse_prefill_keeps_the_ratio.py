"""Block-sparse prefill keeps `ceil(sparse_keep_ratio x visible blocks)` key blocks per query block, its local
blocks counted in (`sparse_prefill._top_blocks`): in each tile of `TILE_QUERY_BLOCKS` query blocks, the block that
wants the most keeps exactly that many (the others keep the tile's count of distant blocks)."""

from __future__ import annotations

import math

import pytest
import torch

from hf_paged.cache.kernels.block_sparse import SPARSE_BLOCK, TILE_QUERY_BLOCKS, visible_blocks
from hf_paged.cache.sparse_prefill import SPARSE_PATTERNS, select_blocks


@pytest.mark.parametrize("pattern", SPARSE_PATTERNS)
@pytest.mark.parametrize("ratio", [0.25, 0.5])
def test_the_block_that_wants_most_in_a_tile_keeps_exactly_its_share(pattern, ratio):
    context_len, q_len = 2048, 1024
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(q_len, 4, 16, generator=g), torch.randn(context_len, 2, 16, generator=g)
    selection = select_blocks(q, k, pattern, ratio, scale=0.25)
    nqb = q_len // SPARSE_BLOCK
    visible = visible_blocks(context_len, q_len, nqb, torch.device("cpu")).tolist()
    local = [v - int(f) for v, f in zip(visible, selection.local_first)]
    for start in range(0, nqb, TILE_QUERY_BLOCKS):
        tile = range(start, min(start + TILE_QUERY_BLOCKS, nqb))
        wanted = {i: max(math.ceil(visible[i] * ratio), local[i] + 1) for i in tile}  # (+1: the sink)
        i = max(tile, key=lambda b: wanted[b] - local[b])
        for h in range(2):
            assert int(selection.keep[h, i]) + local[i] == wanted[i], (start, i, h)
