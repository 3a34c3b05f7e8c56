"""The "cost" policy's aging floor (`RadixCache.inflation`, GDSF's L) only rises: evicting a block valued below it
(a cached tail, which is never touched and has value 0) leaves the floor where it was."""

from __future__ import annotations

from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.radix import RadixCache
from tests.cache.test_radix import cached_request


def test_evicting_a_tail_valued_below_the_floor_does_not_lower_it():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=4, policy="cost")
    cached_request(pool, cache, [1, 2, 3, 4])
    pool.free(pool.allocate(3))  # evicts the one cached block: the floor rises to its value
    floor = cache.inflation
    assert floor > 0
    table = pool.allocate(2)
    cache.insert([5, 6, 7, 8], table[:1])
    assert cache.insert_tail([5, 6, 7, 8, 9, 10], table)
    pool.free(reversed(table))
    taken = pool.allocate(2)  # the free block and one eviction: the tail (value 0) goes first
    assert cache.num_cached_blocks == 1 and cache.peek([5, 6, 7, 8]) == 4
    assert cache.inflation == floor
    pool.free(taken)
    cache.check_integrity()
