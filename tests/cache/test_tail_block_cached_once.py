"""`RadixCache.insert_tail` on a block that already holds a cached tail (a fork sharing the partial block offers it
again with more tokens) answers False and leaves the tree as it was; it never raises."""

from __future__ import annotations

from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.radix import RadixCache


def test_a_block_already_cached_as_a_tail_is_not_cached_again_under_other_tokens():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=4)
    table = pool.allocate(2)
    assert cache.insert([1, 2, 3, 4], table[:1]).num_new_blocks == 1
    assert cache.insert_tail([1, 2, 3, 4, 5, 6], table)
    assert not cache.insert_tail([1, 2, 3, 4, 5, 6, 7], table)  # the same block, a longer tail
    assert not cache.insert_tail([1, 2, 3, 4, 5, 6], table)  # the same tail again
    assert cache.num_cached_blocks == 2
    assert cache.partial_block(table[0], [5, 6, 7]) == (table[1], 2)
    cache.check_integrity()
    pool.free(reversed(table))
    pool.check_integrity()
