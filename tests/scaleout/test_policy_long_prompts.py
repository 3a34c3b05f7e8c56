"""CacheAwareRouter's rules for long prompts (issue 37: prompts as large as a fraction of a replica's work): by-load
choices over every replica, a holder past a bound weighed less what it saves, a hot prefix admitting a replica only
when that replica is lighter after recomputing it, and a prefix's traffic counted as its cost at its holders."""

from __future__ import annotations

import pytest

from hf_paged.scaleout import RouteReason, RouteRequest
from tests.scaleout.test_policy import BS, request, router, send


def test_nothing_cached_goes_to_the_lightest_of_every_replica():
    ids = list(range(100))
    r = router(*ids)
    for i in ids[1:]:  # every replica but 0 has work
        r.on_routed(request(f"w{i}", [10_000 + i]), i)
    for k in range(20):  # 4 random choices would find replica 0 one time in 25
        decision = r.route(request(f"q{k}", [20_000 + k]))
        assert (decision.replica_ids[0], decision.reason) == (0, RouteReason.NO_MATCH)
    r.check_integrity()


def test_a_holder_past_the_work_bound_keeps_a_prompt_whose_saving_outweighs_its_excess():
    r = router("a", "b", "c")
    for k in range(10):  # "a" gets 10 requests of 41 tokens: past 1.2 x the mean work + a mean request
        r.on_routed(request(f"w{k}", [1000 + k, 2000 + k]), "a")
    long = list(range(1, 251))  # 1,001 tokens, all held by "a": far more than a's excess of work
    r.report("a", keys=set(long), load_tokens=0)
    decision = r.route(request("q", long))
    assert (decision.reason, decision.replica_ids[0]) == (RouteReason.IMBALANCED, "a")
    short = long[:3]  # a short prompt saves too little: it goes elsewhere
    decision = r.route(RouteRequest("s", short, num_prompt_tokens=len(short) * BS + 1))
    assert decision.reason is RouteReason.IMBALANCED and decision.replica_ids[0] != "a"


def test_a_hot_prefix_admits_no_replica_that_would_be_heavier_after_recomputing_it():
    r = router("a", "b")
    for k in range(2):
        r.on_routed(request(f"w{k}", [1000 + k]), "a")  # "a" is heavier than "b" by 2 small requests
    long = list(range(1, 101))
    r.report("a", keys=set(long), load_tokens=0)
    r.traffic.track(long[-1]), r.traffic.track(long[1])
    r.traffic.add(long, 1e6)  # the prefix (and its first 2 blocks) is most of the traffic: it wants both replicas
    assert r.traffic.replicas_wanted(long[-1], 2, 1.0) == 2
    decision = r.route(request("q", long))  # "b" would compute 401 tokens to save "a" 8: no
    assert (decision.reason, decision.replica_ids[0]) == (RouteReason.HOT_SPREAD, "a")
    decision = r.route(request("q2", long[:2] + [7777]))  # a short prompt under it: "b" recomputes 8 tokens
    assert (decision.reason, decision.replica_ids[0]) == (RouteReason.HOT_ADMIT, "b")


def test_a_prefix_traffic_is_its_cost_at_the_holders_not_the_recompute():
    r = router("a", "b")
    long = list(range(1, 11))
    r.report("a", keys=set(long), load_tokens=0)
    q = request("q", long, output=4)
    decision = r.route(q)
    assert (decision.reason, decision.replica_ids[0], decision.prefix_key) == (RouteReason.AFFINITY, "a", 10)
    r.on_routed(q, "b", decision)  # "a" refused it: "b" computes all 41 tokens + 4
    send(r, request("x", [99, 98], output=0))  # 9 tokens of other traffic
    # The prefix is credited 1 + 4 tokens (what it costs where it is cached), not 45
    assert r.traffic.share(10) == pytest.approx(5 / 14, rel=1e-3)


def test_a_hot_prefix_whose_holders_are_past_a_bound_admits_no_replica_heavier_after_recomputing_it():
    r = router("a", "b", "c")
    for k in range(10):  # "a" is past the work bound (1.2 x the mean work + a mean request)
        r.on_routed(request(f"w{k}", [1000 + k, 2000 + k]), "a")
    long = list(range(1, 251))  # 1,001 tokens held by "a", far more than its excess of work
    r.report("a", keys=set(long), load_tokens=0)
    r.traffic.track(long[-1]), r.traffic.track(long[1])
    r.traffic.add(long, 1e6)  # the prefix is most of the traffic: it wants every replica
    decision = r.route(request("q", long))  # a newcomer would recompute 1,001 tokens to spare "a" 90: no
    assert (decision.reason, decision.replica_ids[0]) == (RouteReason.IMBALANCED, "a")
    decision = r.route(request("q2", long[:2] + [7777]))  # a short prompt under it: a newcomer recomputes 8 tokens
    assert decision.reason is RouteReason.HOT_ADMIT and decision.replica_ids[0] != "a"
    r.check_integrity()
