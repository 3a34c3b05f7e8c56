"""Two promises of the router's bookkeeping: an AFFINITY decision offers the two fitting holders that save most
before any replica chosen by load (the second holder is the first fallback), and an unconfirmed booking undone after
the decayed-work units were rescaled takes away exactly its own work (the totals stay the replicas' sum)."""

from __future__ import annotations

from hf_paged.scaleout import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest


def test_the_second_fitting_holder_is_the_first_fallback():
    router = CacheAwareRouter(RouterConfig(block_size=4), seed=0)
    for rid in ("a", "b", "c", "d"):
        router.add_replica(rid)
    router.report("a", keys={1, 2, 3}, load_tokens=0)
    router.report("b", keys={1, 2}, load_tokens=0)
    decision = router.route(RouteRequest("r", digests=[1, 2, 3, 4], num_prompt_tokens=17))
    assert decision.reason is RouteReason.AFFINITY
    assert decision.replica_ids[:2] == ["a", "b"]
    assert sorted(decision.replica_ids) == ["a", "b", "c", "d"]


def test_an_old_booking_undone_after_a_rescale_takes_only_its_own_work():
    router = CacheAwareRouter(RouterConfig(block_size=4, balance_half_life=0.05), seed=0)
    router.add_replica("a")
    router.add_replica("b")
    old = RouteRequest("old", digests=[1], num_prompt_tokens=8)
    router.book(old, "a")  # never confirmed
    start_unit = router._unit
    i = 0
    while router._unit >= start_unit:  # route to b until the units are rescaled (they grow every booking)
        request = RouteRequest(f"r{i}", digests=[100 + i], num_prompt_tokens=8)
        router.book(request, "b")
        router.on_routed(request, "b")
        router.on_finished(request.request_id)
        i += 1
        assert i < 100_000
    assert router.work_share("b") > 0.99
    assert router.unbook("old")
    router.check_integrity()  # the work total is still the replicas' sum
    assert router.work_share("b") == 1.0
    assert router.mean_request_tokens > 0
