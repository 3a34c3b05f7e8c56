"""The Ray adapter's bookkeeping without a cluster: summaries taken only when new, their age in the router's view."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

pytest.importorskip("ray")

from hf_paged.scaleout import CacheSummary, ray_router
from hf_paged.scaleout.ray_router import HfPagedRequestRouter


@dataclass(frozen=True)
class FakeId:
    unique_id: str


@dataclass
class FakeReplica:
    replica_id: FakeId
    routing_stats: dict


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
