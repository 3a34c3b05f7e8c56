"""The queue bound's slack is one typical request, size-biased (sum(work^2) / sum(work)), not the plain mean: a
short request's holder that carries one long prefill more than the others keeps its affinity; two do not."""

from __future__ import annotations

import pytest

from hf_paged.scaleout.policy import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest

SYSTEM = list(range(1, 51))  # a system prompt of 50 blocks (800 tokens at 16 a block)


def router_with_history(sizes: list[int], replicas: str = "abcd") -> CacheAwareRouter:
    """Each replica is sent (and finishes) one request of each size, with nothing cached: equal work everywhere."""
    router = CacheAwareRouter(RouterConfig(block_size=16), seed=0)
    for r in replicas:
        router.add_replica(r)
    n = 0
    for r in replicas:
        for size in sizes:
            router.on_routed(RouteRequest(f"h{n}", [10_000 + n], size), r)
            router.on_finished(f"h{n}")
            n += 1
    router.check_integrity()
    return router


def expected_typical(router: CacheAwareRouter, sizes: list[int]) -> float:
    """sum(w^2 u) / sum(w u) over the routed requests, u each one's decay weight (the router's unit at its time)."""
    units = [router._unit * 2.0 ** (-(len(sizes) * 4 - 1 - i) / (50.0 * 4)) for i in range(len(sizes) * 4)]
    works = sizes * 4
    return sum(w * w * u for w, u in zip(works, units)) / sum(w * u for w, u in zip(works, units))


def test_typical_equals_the_mean_when_requests_are_alike():
    router = router_with_history([500] * 10)
    assert router.typical_request_tokens == pytest.approx(router.mean_request_tokens) == pytest.approx(500)


def test_typical_is_size_biased_and_decayed_like_the_work():
    sizes = [1000] * 6 + [20_000]
    router = router_with_history(sizes)
    assert router.typical_request_tokens == pytest.approx(expected_typical(router, sizes), rel=1e-9)
    assert router.typical_request_tokens > 4 * router.mean_request_tokens


def test_unbook_and_removing_a_replica_keep_the_statistic():
    router = router_with_history([1000] * 6 + [20_000])
    before = router.typical_request_tokens
    request = RouteRequest("x", [99], 50_000)
    router.book(request, "a")
    assert router.typical_request_tokens > before
    assert router.unbook("x")
    assert router.typical_request_tokens == pytest.approx(before, rel=1e-12)
    router.remove_replica("d")
    assert router.typical_request_tokens == pytest.approx(before, rel=1e-12)
    router.check_integrity()


def short_request_to(router: CacheAwareRouter, holder_load: int) -> tuple[RouteReason, str, float]:
    """Replica a holds the system prompt and `holder_load` queued tokens, the others nothing; route an 850-token
    prompt under that system prompt. Returns the reason, the first choice and the plain-mean bound."""
    for r in router.replica_ids:
        router.report(r, keys=set(SYSTEM) if r == "a" else set(), load_tokens=holder_load if r == "a" else 0)
    decision = router.route(RouteRequest("q", [*SYSTEM, 501, 502], 850))
    gain = len(SYSTEM) * 16
    plain_bound = holder_load / 4 + router.mean_request_tokens + router.config.queue_factor * gain
    return decision.reason, decision.replica_ids[0], plain_bound


def test_a_holder_one_long_prefill_ahead_keeps_a_short_requests_affinity():
    router = router_with_history([1000] * 6 + [20_000])
    reason, first, plain_bound = short_request_to(router, holder_load=20_000)
    assert 20_000 > plain_bound  # the plain mean request as the slack would send it elsewhere
    assert (reason, first) == (RouteReason.AFFINITY, "a")


def test_a_holder_two_long_prefills_ahead_loses_it():
    router = router_with_history([1000] * 6 + [20_000])
    reason, first, _ = short_request_to(router, holder_load=60_000)
    assert reason == RouteReason.IMBALANCED and first != "a"


def test_with_alike_requests_the_bound_is_as_before():
    router = router_with_history([1000] * 7)
    reason, _, plain_bound = short_request_to(router, holder_load=12_000)
    assert 12_000 > plain_bound and reason == RouteReason.IMBALANCED
