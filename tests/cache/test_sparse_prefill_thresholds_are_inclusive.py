"""Which chunks block-sparse prefill takes (`SparsePrefill.applies`; README: a chunk whose context reaches
`sparse_prefill_min_tokens`, with at least one 64-query block): both bounds are inclusive."""

from __future__ import annotations

from hf_paged.cache.kernels.block_sparse import SPARSE_BLOCK
from hf_paged.cache.sparse_prefill import SparsePrefill


def test_a_chunk_of_one_query_block_at_the_minimum_context_is_sparse():
    sparse = SparsePrefill("block", min_tokens=128, keep_ratio=0.5)
    assert sparse.applies(SPARSE_BLOCK, 128)
    assert not sparse.applies(SPARSE_BLOCK - 1, 128)
    assert not sparse.applies(SPARSE_BLOCK, 127)
    assert sparse.applies(SPARSE_BLOCK + 1, 4096)
