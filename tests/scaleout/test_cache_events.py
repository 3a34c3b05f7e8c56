"""Block events on the wire, and a replica's reports: a summary now and then, the events after it in between."""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import pytest

from hf_paged.cache.block_events import BlockEvent, BlockEventKind
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.radix import RadixCache
from hf_paged.scaleout import CacheSummary, build_summary, prompt_fingerprints
from hf_paged.scaleout.cache_events import CacheEvents, pack_events
from hf_paged.scaleout.routing_stats import RoutingStats
from tests.cache.test_radix import cached_request

S, R, C = int(BlockEventKind.STORED), int(BlockEventKind.REMOVED), int(BlockEventKind.CLEARED)


def test_events_pack_as_fingerprints_and_round_trip():
    a, b = b"\x01" * 16, b"\x02" * 16
    packed = pack_events([BlockEvent(4, BlockEventKind.STORED, a), BlockEvent(5, BlockEventKind.REMOVED, b),
                          BlockEvent(6, BlockEventKind.CLEARED, None)], first_seq=4)
    assert (packed.first_seq, packed.last_seq, packed.num_events, packed.nbytes) == (4, 6, 3, 3 + 24 + 16)
    assert packed.kinds == bytes([S, R, C])
    again = CacheEvents.from_stats(packed.to_stats())
    assert again == packed
    kinds, keys = again.after(4)
    assert (kinds, list(keys)) == (bytes([R, C]), [0x0202020202020202, 0])
    kinds, keys = again.after(0)
    assert (kinds, list(keys)) == (bytes([S, R, C]), [0x0101010101010101, 0x0202020202020202, 0])
    assert again.after(6)[0] == b""
    with pytest.raises(ValueError, match="the events start at 4, not 3"):
        pack_events([BlockEvent(4, BlockEventKind.STORED, a)], first_seq=3)
    with pytest.raises(ValueError, match="2 event kinds but 8 fingerprint bytes"):
        CacheEvents.from_stats({"first_seq": 1, "kinds": bytes([S, S]), "fingerprints": bytes(8)})
    with pytest.raises(ValueError, match="unknown block event kind"):
        CacheEvents.from_stats({"first_seq": 1, "kinds": bytes([7]), "fingerprints": bytes(8)})


def fake_reporter(cache: RadixCache, num_blocks: int) -> SimpleNamespace:
    """What RoutingStats uses of a ReplicaReporter: its engine's prefix cache and pool size, and summary()."""
    seqs = itertools.count(1)
    engine = SimpleNamespace(kv=SimpleNamespace(prefix_cache=cache), cache=SimpleNamespace(num_blocks=num_blocks))
    return SimpleNamespace(engine=engine, summary=lambda: build_summary(cache, seq=next(seqs), now=0.0))


def test_reports_carry_the_summary_and_every_event_after_it():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=2)
    cached_request(pool, cache, [1, 2, 3, 4])  # before anyone listened: only in summaries
    stats = RoutingStats(fake_reporter(cache, 8), summary_every=3)
    first = stats.poll()
    summary = CacheSummary.from_stats(first)
    assert (summary.seq, summary.event_seq, summary.num_fingerprints) == (1, 0, 2)
    assert first["events"] == {"first_seq": 1, "kinds": b"", "fingerprints": b""}
    cached_request(pool, cache, [5, 6])
    second = stats.poll()
    assert second["seq"] == 1  # the same summary ...
    assert CacheEvents.from_stats(second["events"]) == CacheEvents(1, bytes([S]), _keys([5, 6]))  # ... + its events
    cached_request(pool, cache, [5, 6, 7, 8])
    third = stats.poll()  # everything since the summary, not since the previous poll: a router may miss a poll
    block_78 = _keys([5, 6, 7, 8])[8:]  # [7 8] chained after [5 6]
    assert CacheEvents.from_stats(third["events"]) == CacheEvents(1, bytes([S, S]), _keys([5, 6]) + block_78)
    fourth = stats.poll()  # the third poll after a summary: a new one, with the events so far inside it
    assert (fourth["seq"], fourth["event_seq"], fourth["events"]["first_seq"], fourth["events"]["kinds"]) == (2, 2, 3, b"")
    assert CacheSummary.from_stats(fourth).num_fingerprints == 4
    assert (stats.num_summaries, stats.num_resyncs) == (2, 0)


def _keys(tokens: list[int]) -> bytes:
    return b"".join(k.to_bytes(8, "little") for k in prompt_fingerprints(tokens, 2))


def test_too_many_events_or_a_dropped_one_brings_a_new_summary_early():
    pool = BlockPool(64)
    cache = RadixCache(pool, block_size=1)
    stats = RoutingStats(fake_reporter(cache, 64), summary_every=100, max_events=3)
    assert stats.poll()["seq"] == 1
    cached_request(pool, cache, [1, 2])
    assert stats.poll()["seq"] == 1
    cached_request(pool, cache, [3, 4])  # 4 events since the summary: past max_events
    report = stats.poll()
    assert (report["seq"], report["event_seq"], report["events"]["kinds"]) == (2, 4, b"")
    assert (stats.num_summaries, stats.num_resyncs) == (2, 1)
    assert stats.log is not None and stats.log.capacity == 1024


def test_without_events_every_poll_is_a_summary():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=2)
    stats = RoutingStats(fake_reporter(cache, 8), events=False, summary_every=10)
    assert [stats.poll()["seq"] for _ in range(3)] == [1, 2, 3]
    assert "events" not in stats.poll() and cache.events is None  # nothing recorded
    with pytest.raises(ValueError, match="summary_every must be an int >= 1"):
        RoutingStats(fake_reporter(cache, 8), summary_every=0)


def test_an_engine_replica_reports_the_blocks_it_cached_as_events():
    from hf_paged.batching.engine import Engine
    from hf_paged.batching.sampling import SamplingParams
    from hf_paged.config import PagedConfig
    from hf_paged.scaleout.replica import ReplicaReporter
    from tests.tiny_models import tiny_model

    engine = Engine(tiny_model(), PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64))
    reporter = ReplicaReporter(engine)
    stats = RoutingStats(reporter, summary_every=10)
    assert stats.poll()["num_cached_blocks"] == 0
    prompt = list(range(3, 21))  # 18 tokens: 4 full blocks
    engine.run([engine.add_request(prompt, SamplingParams(max_new_tokens=3))])
    events = CacheEvents.from_stats(stats.poll()["events"])
    kinds, keys = events.after(0)
    assert events.first_seq == 1 and set(kinds) == {S}
    assert list(keys[:4]) == prompt_fingerprints(prompt, 4, reporter.extra_keys)  # in order, parents first
    assert len(keys) == engine.kv.prefix_cache.num_cached_blocks
