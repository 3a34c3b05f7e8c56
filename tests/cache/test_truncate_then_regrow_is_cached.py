"""`KVCacheManager.truncate` into a block the prefix cache holds: the block is copied on the next write, and the
copy, once full again, is inserted into the cache (the sequence no longer counts it as cached)."""

from __future__ import annotations

from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import BlockCopy, KVCacheManager
from hf_paged.cache.radix import RadixCache


def _sequence() -> tuple[KVCacheManager, RadixCache]:
    """A manager of 8 blocks of 4 tokens over a prefix cache, with one sequence "s"."""
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=4)
    kv = KVCacheManager(pool, 4, cache)
    kv.add_sequence("s")
    return kv, cache


def test_a_block_rewritten_after_a_truncate_into_it_is_cached_again():
    kv, cache = _sequence()
    assert kv.allocate_slots("s", 8)
    kv.cache_full_blocks("s", [1, 2, 3, 4, 5, 6, 7, 8])
    old = list(kv.block_ids("s"))
    kv.truncate("s", 5)  # back into the second (cached) block
    assert kv.block_ids("s") == old and kv.num_tokens("s") == 5
    assert kv.allocate_slots("s", 3)
    new_block = kv.block_ids("s")[1]
    assert kv.take_pending_copies() == [BlockCopy(old[1], new_block)]  # the cache's block is never written
    rewritten = [1, 2, 3, 4, 5, 9, 9, 9]
    assert kv.has_uncached_full_blocks("s", 8)
    kv.cache_full_blocks("s", rewritten)
    assert cache.match(rewritten).block_ids == [old[0], new_block]
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8]).block_ids == old  # the first version is still served
    kv.check_integrity()
    kv.free("s")
    kv.check_integrity()


def test_truncate_to_a_block_boundary_keeps_the_whole_cached_blocks_counted():
    kv, _ = _sequence()
    assert kv.allocate_slots("s", 12)
    kv.cache_full_blocks("s", list(range(1, 13)))
    kv.truncate("s", 8)
    assert len(kv.block_ids("s")) == 2 and not kv.has_uncached_full_blocks("s", 8)
    assert kv.allocate_slots("s", 1) and kv.take_pending_copies() == []  # a fresh block, nothing to copy
    kv.check_integrity()
