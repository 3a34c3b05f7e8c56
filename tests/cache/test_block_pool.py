"""BlockPool: exact-id unit tests and hypothesis property tests over simulated block tables."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from hf_paged.cache.block_pool import BlockPool


class ListEvictor:
    """Gives back idle cached blocks in a fixed order and records what it was asked."""

    def __init__(self, pool: BlockPool, order: list[int]) -> None:
        self.pool, self.order = pool, order
        self.calls: list[int] = []

    def evict(self, num_blocks: int) -> list[int]:
        self.calls.append(num_blocks)
        idle = self.pool.idle_cached_blocks()
        return [b for b in self.order if b in idle][:num_blocks]


# -- exact ids -----------------------------------------------------------------------------------------
def test_allocate_hands_out_ids_in_order_and_reuses_least_recently_freed_first():
    pool = BlockPool(4)
    assert pool.allocate(4) == [0, 1, 2, 3]
    pool.free([3, 2])  # a table's tail first
    pool.free([0])
    assert pool.allocate(2) == [3, 2]
    assert pool.allocate(1) == [0]
    assert pool.ref_counts == [1, 1, 1, 1]
    pool.check_integrity({0: 1, 1: 1, 2: 1, 3: 1})


def test_allocate_that_does_not_fit_returns_none_and_changes_nothing():
    pool = BlockPool(3)
    assert pool.allocate(2) == [0, 1]
    assert not pool.can_allocate(2) and pool.can_allocate(1)
    assert pool.allocate(2) is None
    assert (pool.num_free_blocks, pool.num_used_blocks, pool.ref_counts) == (1, 2, [1, 1, 0])
    assert pool.allocate(0) == []
    pool.check_integrity({0: 1, 1: 1})


def test_shared_block_is_free_only_after_its_last_reference():
    pool = BlockPool(2)
    [block] = pool.allocate(1)
    pool.incref([block])
    pool.free([block])
    assert (pool.ref_counts[block], pool.num_free_blocks) == (1, 1)
    pool.free([block])
    assert (pool.ref_counts[block], pool.num_free_blocks) == (0, 2)
    pool.check_integrity({})


def test_misuse_raises_with_the_block_named():
    pool = BlockPool(3)
    ids = pool.allocate(1)
    pool.free(ids)
    with pytest.raises(RuntimeError, match="block 0 freed twice"):
        pool.free(ids)
    with pytest.raises(RuntimeError, match="block 1 is free: it cannot be shared"):
        pool.incref([1])
    with pytest.raises(RuntimeError, match="block 2 is not in use"):
        pool.mark_cached(2)
    with pytest.raises(ValueError, match="negative"):
        pool.allocate(-1)
    pool.check_integrity({})


@pytest.mark.parametrize("block_id", [-1, 3])
def test_out_of_range_ids_raise_instead_of_wrapping(block_id):
    pool = BlockPool(3)
    pool.allocate(3)
    for op in (pool.free, pool.incref):
        with pytest.raises(IndexError, match=f"block id {block_id} is out of range"):
            op([block_id])
    with pytest.raises(IndexError, match="out of range"):
        pool.mark_cached(block_id)
    assert pool.ref_counts == [1, 1, 1]
    pool.check_integrity({0: 1, 1: 1, 2: 1})


@pytest.mark.parametrize("num_blocks", [0, -2, True, 2.0])
def test_bad_pool_size_raises(num_blocks):
    with pytest.raises(ValueError, match="num_blocks must be a positive int"):
        BlockPool(num_blocks)


def test_cached_blocks_stay_idle_until_free_blocks_run_out():
    pool = BlockPool(4)
    evictor = pool.evictor = ListEvictor(pool, order=[1, 0])
    ids = pool.allocate(2)
    pool.mark_cached(0)
    pool.mark_cached(1)
    pool.free(ids)
    assert (pool.num_free_blocks, pool.num_idle_cached_blocks, pool.num_cached_blocks) == (4, 2, 2)
    assert pool.allocate(2) == [2, 3]  # the two free blocks first: the cache keeps everything it can
    assert evictor.calls == []
    assert pool.allocate(1) == [1]  # now the evictor's order decides
    assert (evictor.calls, pool.num_evictions, pool.is_cached(1), pool.is_cached(0)) == ([1], 1, False, True)
    pool.incref([0])  # a prefix hit revives an idle cached block
    assert (pool.ref_counts[0], pool.num_idle_cached_blocks, pool.num_free_blocks) == (1, 0, 0)
    pool.check_integrity({0: 1, 1: 1, 2: 1, 3: 1})


def test_uncache_frees_an_idle_block_and_leaves_an_in_use_one_alone():
    pool = BlockPool(2)
    assert pool.allocate(2) == [0, 1]
    pool.mark_cached(0)
    pool.mark_cached(1)
    pool.free([0])
    pool.uncache(0)
    pool.uncache(1)
    assert (pool.num_cached_blocks, pool.num_free_blocks, pool.ref_counts) == (0, 1, [0, 1])
    pool.free([1])
    assert pool.allocate(2) == [0, 1]
    pool.check_integrity({0: 1, 1: 1})


def test_evictor_returning_a_wrong_or_short_list_raises():
    pool = BlockPool(2)
    assert pool.allocate(2) == [0, 1]
    pool.mark_cached(0)
    pool.free([0])
    pool.evictor = ListEvictor(pool, order=[])
    with pytest.raises(RuntimeError, match="gave back 0 blocks, 1 were needed"):
        pool.allocate(1)

    class Wrong:
        def evict(self, num_blocks):
            return [1]  # in use

    pool.evictor = Wrong()
    with pytest.raises(RuntimeError, match="evictor returned block 1, which is not idle cached"):
        pool.allocate(1)


# -- properties ----------------------------------------------------------------------------------------
BLOCK_SIZE = 2


class PoolMachine(RuleBasedStateMachine):
    """Sequences own block tables; they allocate, append (copy-on-write), fork, free; some blocks get cached."""

    def __init__(self) -> None:
        super().__init__()
        self.pool = BlockPool(8)
        self.tables: dict[int, list[int]] = {}
        self.lengths: dict[int, int] = {}
        self.cached: set[int] = set()  # model of the pool's cached set
        self.next_seq = 0

    def expected_refs(self) -> dict[int, int]:
        refs: dict[int, int] = {}
        for table in self.tables.values():
            for block in table:
                refs[block] = refs.get(block, 0) + 1
        return refs

    def take(self, num_blocks: int) -> list[int] | None:
        refs = self.expected_refs()
        fits = self.pool.can_allocate(num_blocks)
        ids = self.pool.allocate(num_blocks)
        assert (ids is not None) == fits
        assert fits == (num_blocks <= self.pool.num_blocks - len(refs))
        if ids is not None:
            assert len(set(ids)) == num_blocks and not set(ids) & set(refs), "handed out a block in use"
            self.cached -= set(ids)  # an idle cached block handed out was evicted
        return ids

    @rule(num_tokens=st.integers(1, 7))
    def allocate(self, num_tokens):
        ids = self.take(-(-num_tokens // BLOCK_SIZE))
        if ids is not None:
            self.tables[self.next_seq], self.lengths[self.next_seq] = ids, num_tokens
            self.next_seq += 1

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def append(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tables)))
        table = self.tables[seq]
        if self.lengths[seq] % BLOCK_SIZE == 0:
            ids = self.take(1)
            if ids is None:
                return
            table.extend(ids)
        elif self.pool.ref_counts[table[-1]] > 1:  # shared partial block: copy on write
            ids = self.take(1)
            if ids is None:
                return
            self.pool.free([table[-1]])
            table[-1] = ids[0]
        self.lengths[seq] += 1

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def fork(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tables)))
        self.pool.incref(self.tables[seq])
        self.tables[self.next_seq], self.lengths[self.next_seq] = list(self.tables[seq]), self.lengths[seq]
        self.next_seq += 1

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def free(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tables)))
        self.pool.free(reversed(self.tables.pop(seq)))
        del self.lengths[seq]

    @precondition(lambda self: self.tables)
    @rule(data=st.data())
    def cache_full_block(self, data):
        seq = data.draw(st.sampled_from(sorted(self.tables)))
        num_full = self.lengths[seq] // BLOCK_SIZE
        if num_full:
            block = self.tables[seq][data.draw(st.integers(0, num_full - 1))]
            self.pool.mark_cached(block)
            self.cached.add(block)

    @precondition(lambda self: self.cached)
    @rule(data=st.data())
    def prefix_hit(self, data):
        # A new sequence starts on a cached full block (in use or idle): the pool shares it.
        block = data.draw(st.sampled_from(sorted(self.cached)))
        self.pool.incref([block])
        self.tables[self.next_seq], self.lengths[self.next_seq] = [block], BLOCK_SIZE
        self.next_seq += 1

    @precondition(lambda self: self.cached)
    @rule(data=st.data())
    def uncache(self, data):
        block = data.draw(st.sampled_from(sorted(self.cached)))
        self.pool.uncache(block)
        self.cached.discard(block)

    @rule()
    def double_free_is_caught(self):
        refs = self.expected_refs()
        idle = next((b for b in range(self.pool.num_blocks) if b not in refs), None)
        if idle is not None:
            with pytest.raises(RuntimeError, match="freed twice"):
                self.pool.free([idle])

    @invariant()
    def integrity(self):
        refs = self.expected_refs()
        self.pool.check_integrity(refs)
        idle_cached = {b for b in self.cached if b not in refs}
        assert self.pool.num_cached_blocks == len(self.cached)
        assert self.pool.idle_cached_blocks() == idle_cached
        assert self.pool.num_used_blocks == len(refs)
        assert self.pool.num_free_blocks == self.pool.num_blocks - len(refs)
        for seq, table in self.tables.items():
            assert len(table) == -(-self.lengths[seq] // BLOCK_SIZE)

    def teardown(self):
        for table in self.tables.values():
            self.pool.free(reversed(table))
        self.pool.check_integrity({})
        assert self.pool.num_free_blocks == self.pool.num_blocks, "a block leaked"


PoolMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestPoolProperties = PoolMachine.TestCase
