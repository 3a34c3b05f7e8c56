"""ReplicaView and CacheAwareRouter.apply_events: block events keep the router's view of a replica current between
its summaries."""

from __future__ import annotations

import pytest

from hf_paged.cache.block_events import BlockEventKind
from hf_paged.scaleout import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest
from hf_paged.scaleout.replica_view import ReplicaView

S, R, C = int(BlockEventKind.STORED), int(BlockEventKind.REMOVED), int(BlockEventKind.CLEARED)


def test_events_apply_in_order_on_top_of_the_report():
    view = ReplicaView("a")
    report = frozenset({1, 2})
    view.take_report(report, load_tokens=10)
    view.apply_events(bytes([S, S, R]), [3, 4, 4])  # 4 stored then evicted: gone
    assert view.keys == {1, 2, 3} and report == {1, 2}  # the shared report is copied, never changed
    assert view.match([1, 2, 3, 4]) == 3 and view.num_events == 3
    view.apply_events(bytes([R, S]), [3, 3])  # evicted then stored again: held
    assert view.keys == {1, 2, 3} and view.num_events == 5
    view.apply_events(b"", [])
    assert view.num_events == 5


def test_a_removed_block_is_forgotten_from_what_was_sent_too():
    view = ReplicaView("a")
    view.sent.update({1, 2, 3})
    view.take_report(frozenset({1}), load_tokens=0)  # 1, 2, 3 move to sent_before
    view.sent.add(7)
    view.apply_events(bytes([R, R]), [3, 7])
    assert (view.keys, view.sent, view.sent_before) == ({1}, set(), {1, 2})
    assert view.match([1, 2, 3]) == 2


def test_cleared_forgets_everything_then_later_events_apply():
    view = ReplicaView("a")
    view.take_report(frozenset({1, 2}), load_tokens=0)
    view.sent.add(5)
    view.apply_events(bytes([C, S]), [0, 9])
    assert (view.keys, view.sent, view.sent_before) == ({9}, set(), set())
    view.take_report(frozenset({1}), load_tokens=0)  # a summary replaces what events built
    assert view.keys == frozenset({1})


def test_the_router_routes_by_what_events_told_it():
    router = CacheAwareRouter(RouterConfig(block_size=4), seed=0)
    for replica in ("a", "b"):
        router.add_replica(replica)
        router.report(replica, keys=(), load_tokens=0)
    request = RouteRequest("q", [11, 12, 13], num_prompt_tokens=13)
    assert router.route(request).reason == RouteReason.NO_MATCH
    assert router.apply_events("b", bytes([S, S]), [11, 12])
    decision = router.route(request)
    assert (decision.replica_ids[0], decision.reason, decision.num_cached_blocks) == ("b", RouteReason.AFFINITY, 2)
    assert router.replica_stats("b")["num_events"] == 2 and router.replica_stats("b")["num_fingerprints"] == 2
    assert router.apply_events("b", bytes([R]), [12])
    assert router.route(request).num_cached_blocks == 1
    assert not router.apply_events("gone", bytes([S]), [11])  # an unknown replica: ignored
    router.check_integrity()


def test_a_bad_report_or_event_batch_is_refused_naming_it():
    """NaN / inf / None loads raised int()'s own errors naming nothing; events with fewer keys than kinds were cut
    by zip and an unknown kind code cleared the view (h8 F8)."""
    view = ReplicaView("a")
    for load in (float("nan"), float("inf"), None, -1, True):
        with pytest.raises(ValueError, match="load_tokens"):
            view.take_report(frozenset({1}), load_tokens=load)
    view.take_report(frozenset({1}), load_tokens=3)
    with pytest.raises(ValueError, match="one key per kind"):
        view.apply_events(bytes([S, S]), [5])
    with pytest.raises(ValueError, match=r"kinds \[7\]"):
        view.apply_events(bytes([7]), [5])
    assert view.keys == {1} and view.reported_load == 3
