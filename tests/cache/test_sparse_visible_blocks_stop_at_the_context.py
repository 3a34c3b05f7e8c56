"""`block_sparse.visible_blocks`: a last, partial query block sees the context's key blocks and no more (its padding
rows lie past the context; counting their blocks inflated its share of kept blocks and `kept_share`)."""

from __future__ import annotations

import torch

from hf_paged.cache.kernels.block_sparse import SPARSE_BLOCK, visible_blocks


def test_a_partial_last_query_block_sees_only_the_context():
    cpu = torch.device("cpu")
    assert visible_blocks(777, 130, 3, cpu).tolist() == [12, 13, 13]  # 777 keys: 13 blocks (the last partial)
    assert visible_blocks(200, 200, 4, cpu).tolist() == [1, 2, 3, 4]
    assert visible_blocks(64, 64, 1, cpu).tolist() == [1]
    for context_len, q_len in ((300, 130), (1000, 200), (129, 65)):
        nqb = -(-q_len // SPARSE_BLOCK)
        assert int(visible_blocks(context_len, q_len, nqb, cpu).max()) == -(-context_len // SPARSE_BLOCK)
