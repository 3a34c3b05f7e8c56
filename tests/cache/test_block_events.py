"""Block events: the bounded numbered log, and the radix tree recording stored / removed / cleared blocks."""

from __future__ import annotations

import pytest

from hf_paged.cache.block_events import BlockEvent, BlockEventKind, BlockEventLog, EventsSince
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.digests import prefix_digests
from hf_paged.cache.radix import RadixCache
from tests.cache.test_radix import cached_request

S, R, C = BlockEventKind.STORED, BlockEventKind.REMOVED, BlockEventKind.CLEARED


def kinds_and_digests(got: EventsSince) -> list[tuple[BlockEventKind, bytes | None]]:
    return [(e.kind, e.digest) for e in got.events]


def test_the_log_numbers_events_and_answers_from_a_cursor():
    log = BlockEventLog(capacity=8)
    assert log.since(0) == EventsSince([], 0, resync=False)
    log.record(S, b"a")
    log.record(S, b"b")
    log.record(R, b"a")
    assert log.since(0) == EventsSince([BlockEvent(1, S, b"a"), BlockEvent(2, S, b"b"), BlockEvent(3, R, b"a")], 3,
                                       resync=False)
    assert log.since(2) == EventsSince([BlockEvent(3, R, b"a")], 3, resync=False)
    assert log.since(3) == EventsSince([], 3, resync=False)
    with pytest.raises(ValueError, match="cursor 4 is ahead of the log's last event 3"):
        log.since(4)
    with pytest.raises(ValueError, match="capacity must be an int >= 1"):
        BlockEventLog(0)


def test_an_overflowed_log_tells_a_consumer_behind_it_to_resync():
    log = BlockEventLog(capacity=3)
    for digest in (b"a", b"b", b"c", b"d", b"e"):  # 1, 2 dropped; 3, 4, 5 held
        log.record(S, digest)
    assert log.since(1) == EventsSince([], 5, resync=True)  # event 2 is lost: a gap, never silent
    assert log.since(0) == EventsSince([], 5, resync=True)
    assert log.since(2) == EventsSince([BlockEvent(3, S, b"c"), BlockEvent(4, S, b"d"), BlockEvent(5, S, b"e")], 5,
                                       resync=False)
    assert log.since(4) == EventsSince([BlockEvent(5, S, b"e")], 5, resync=False)


def test_the_tree_records_nothing_until_someone_listens():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=2)
    cached_request(pool, cache, [1, 2, 3, 4])
    assert cache.events is None
    log = cache.listen(capacity=16)
    assert cache.listen() is log and log.seq == 0  # a second consumer shares the log
    cached_request(pool, cache, [1, 2, 3, 4])  # all cached already: nothing new stored
    assert log.seq == 0


def test_stored_removed_and_cleared_blocks_in_order():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=2)
    log = cache.listen(capacity=16)
    a, b = prefix_digests([1, 2, 3, 4], 2)
    (c,) = prefix_digests([5, 6], 2)
    d, e = prefix_digests([1, 2, 7, 8], 2)
    cached_request(pool, cache, [1, 2, 3, 4])
    cached_request(pool, cache, [5, 6])
    assert kinds_and_digests(log.since(0)) == [(S, a), (S, b), (S, c)]
    cached_request(pool, cache, [1, 2, 7, 8])  # block [1 2] is reused (no event); [7 8] needs a block: evicts [3 4]
    assert kinds_and_digests(log.since(3)) == [(R, b), (S, e)]
    assert d == a
    running = pool.allocate(1)
    cache.insert([9, 9], running)
    (f,) = prefix_digests([9, 9], 2)
    assert cache.reset() == 3  # [1 2], [7 8], [9 9]
    assert kinds_and_digests(log.since(5)) == [(R, c), (S, f), (C, None)]  # [5 6] evicted for the running block
    assert log.seq == 8
    cache.check_integrity()


def test_a_subtree_dropped_whole_reports_each_block_children_first():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=1)
    log = cache.listen()
    table = pool.allocate(3)
    cache.insert([1, 2, 3], table)
    pool.free(table[:1])  # the root block [1] is idle, its children still in use: only the subtree can go
    a, b, c = prefix_digests([1, 2, 3], 1)
    assert pool.allocate(1) == [table[0]]
    assert kinds_and_digests(log.since(3)) == [(R, c), (R, b), (R, a)]
    cache.check_integrity()
