"""The Ray adapter's bookkeeping without a cluster: summaries taken only when new, their age in the router's view,
block events applied once and in order, a gap left for the next summary."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

pytest.importorskip("ray")

from hf_paged.cache.block_events import BlockEventKind
from hf_paged.scaleout import CacheSummary, ray_router
from hf_paged.scaleout.cache_events import CacheEvents
from hf_paged.scaleout.ray_router import HfPagedRequestRouter

S, R = int(BlockEventKind.STORED), int(BlockEventKind.REMOVED)


@dataclass(frozen=True)
class FakeId:
    unique_id: str


@dataclass
class FakeReplica:
    replica_id: FakeId
    routing_stats: dict = field(default_factory=dict)


def summary_stats(seq: int, keys: list[int], created_at: float) -> dict:
    blob = b"".join(k.to_bytes(8, "little") for k in keys)
    return CacheSummary(4, blob, len(keys), 0, seq, created_at).to_stats()


def test_an_unchanged_summary_is_not_unpacked(monkeypatch):
    router = object.__new__(HfPagedRequestRouter)  # no Serve controller: only the state our methods use
    router.initialize_state(block_size=4)
    unpacked = []
    real = CacheSummary.from_stats
    monkeypatch.setattr(ray_router.CacheSummary, "from_stats", lambda stats: unpacked.append(1) or real(stats))
    replica = FakeReplica(FakeId("a"), {})
    router.policy.add_replica(replica.replica_id)
    router._take_report(replica)  # nothing reported yet
    assert unpacked == [] and router.snapshot()["replicas"]["a"]["summary_age_s"] is None
    replica.routing_stats = summary_stats(1, [11, 12], created_at=0.0)
    for _ in range(5):
        router._take_report(replica)
    assert len(unpacked) == 1 and router.policy.replica_stats(replica.replica_id)["num_reports"] == 1
    replica.routing_stats = summary_stats(2, [11, 12, 13], created_at=0.0)
    router._take_report(replica)
    assert len(unpacked) == 2 and router.policy.replica_stats(replica.replica_id)["num_fingerprints"] == 3
    assert router.snapshot()["replicas"]["a"]["summary_age_s"] > 1e9  # created at the epoch: its age is shown


def report_stats(seq: int, keys: list[int], event_seq: int, events: list[tuple[int, int]], first_seq: int) -> dict:
    """A replica's report: a summary holding `keys` as of block event `event_seq`, and events numbered from
    `first_seq` as (kind, fingerprint)."""
    stats = CacheSummary(4, _blob(keys), len(keys), 0, seq, 0.0, event_seq).to_stats()
    stats["events"] = CacheEvents(first_seq, bytes(k for k, _ in events), _blob([f for _, f in events])).to_stats()
    return stats


def _blob(keys: list[int]) -> bytes:
    return b"".join(k.to_bytes(8, "little") for k in keys)


def adapter_with(replica: FakeReplica) -> HfPagedRequestRouter:
    router = object.__new__(HfPagedRequestRouter)
    router.initialize_state(block_size=4)
    router.policy.add_replica(replica.replica_id)
    return router


def held(router: HfPagedRequestRouter, replica: FakeReplica) -> set:
    return set(router.policy._replicas[replica.replica_id].keys)


def test_events_after_the_summary_apply_once_in_order():
    replica = FakeReplica(FakeId("a"), report_stats(1, [11], event_seq=5, events=[], first_seq=6))
    router = adapter_with(replica)
    router._take_report(replica)
    assert held(router, replica) == {11} and router._event_cursor[replica.replica_id] == 5
    replica.routing_stats = report_stats(1, [11], 5, [(S, 12), (S, 13)], first_seq=6)
    router._take_report(replica)
    assert held(router, replica) == {11, 12, 13} and router._event_cursor[replica.replica_id] == 7
    router._take_report(replica)  # the same report again: nothing applied twice
    assert router.policy.replica_stats(replica.replica_id)["num_events"] == 2
    replica.routing_stats = report_stats(1, [11], 5, [(S, 12), (S, 13), (R, 13), (R, 12)], first_seq=6)
    router._take_report(replica)  # the report holds every event since its summary: only 8 and 9 are new
    assert held(router, replica) == {11} and router.policy.replica_stats(replica.replica_id)["num_events"] == 4
    replica.routing_stats = report_stats(2, [20], 9, [(S, 21)], first_seq=10)  # a new summary resets the view
    router._take_report(replica)
    assert held(router, replica) == {20, 21} and router._event_cursor[replica.replica_id] == 10
    assert router.snapshot()["event_gaps"] == 0


def test_events_past_a_gap_wait_for_the_next_summary():
    replica = FakeReplica(FakeId("a"), report_stats(1, [11], event_seq=5, events=[], first_seq=6))
    router = adapter_with(replica)
    router._take_report(replica)
    replica.routing_stats = report_stats(1, [11], 5, [(S, 12)], first_seq=7)  # event 6 is missing
    router._take_report(replica)
    assert held(router, replica) == {11} and router._event_cursor[replica.replica_id] == 5
    assert router.snapshot()["event_gaps"] == 1
    replica.routing_stats = report_stats(2, [11, 12], 7, [(S, 13)], first_seq=8)
    router._take_report(replica)
    assert held(router, replica) == {11, 12, 13} and router._event_cursor[replica.replica_id] == 8


def test_events_without_a_summary_taken_are_not_applied():
    replica = FakeReplica(FakeId("a"), report_stats(1, [11], event_seq=0, events=[(S, 12)], first_seq=1))
    replica.routing_stats["block_size"] = 8  # refused: the router digests 4-token blocks
    router = adapter_with(replica)
    router._take_report(replica)
    assert held(router, replica) == set() and replica.replica_id not in router._event_cursor
