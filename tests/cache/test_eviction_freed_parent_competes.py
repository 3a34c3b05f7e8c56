"""`RadixCache.evict`: a parent whose last child was just evicted becomes an idle leaf and competes in policy order
with the other leaves in the same call (as the docstring promises), also under a custom policy that orders a parent
before its children: it is not held back until every other leaf is gone."""

from __future__ import annotations

from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.radix import RadixCache
from tests.cache.test_radix import cached_request


class LowestBlockFirst:
    """A custom policy: the lowest block id goes first (here a parent sorts before its child)."""

    name = "lowest-block-first"

    def sort_key(self, node):
        return (node.block_id,)


def test_a_parent_left_childless_is_evicted_before_a_leaf_the_policy_ranks_later():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1, policy=LowestBlockFirst())
    assert cached_request(pool, cache, [1, 2]) == [0, 1]  # parent block 0, its child block 1
    assert cached_request(pool, cache, [5]) == [2]  # another leaf, ranked after both
    taken = pool.allocate(3)  # the free block 3, then two evictions
    assert taken is not None and sorted(taken) == [0, 1, 3]
    assert cache.match([5]).num_tokens == 1, "the leaf the policy ranks last must survive"
    assert cache.match([1, 2]).num_tokens == 0
    cache.check_integrity()
    pool.free(taken)
    pool.check_integrity()
