"""After token pruning drops a block from a sequence's table, the table is no longer a token prefix past the first
dropped block: `cache_full_blocks` inserts only the untouched leading blocks, so a later prompt never gets a block
whose K/V belong to other positions (a wrong answer on a prefix hit)."""

from __future__ import annotations

from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.radix import RadixCache


def test_a_pruned_sequence_caches_only_the_blocks_before_its_first_dropped_block():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=4)
    kv = KVCacheManager(pool, 4, cache)
    tokens = list(range(1, 17))  # four full blocks
    kv.add_sequence("s", tokens)
    assert kv.allocate_slots("s", 16)
    table = list(kv.block_ids("s"))
    kv.drop_blocks("s", [1])  # pruning: positions 4..7 gone, later blocks move up the table
    assert kv.block_ids("s") == [table[0], table[2], table[3]]
    kv.cache_full_blocks("s", tokens)
    assert cache.match(tokens).block_ids == [table[0]], "a block past the dropped one was cached at the wrong prefix"
    assert cache.num_cached_blocks == 1
    kv.check_integrity()
    kv.free("s")
    # a new prompt with the same tokens is served the first block only, and computes the rest
    assert kv.add_sequence("t", tokens) == 4
    kv.check_integrity()
