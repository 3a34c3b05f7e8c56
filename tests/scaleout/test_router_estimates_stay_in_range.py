"""The router's estimates stay in range: a replica's load never goes below zero when more work finishes than the
router counted since the report (the report already held it), and a hot prefix never wants more replicas than
there are, whatever `hot_threshold` says."""

from __future__ import annotations

from hf_paged.scaleout import CacheAwareRouter, PrefixTraffic, RouterConfig, RouteRequest


def test_a_load_never_goes_below_zero():
    router = CacheAwareRouter(RouterConfig(block_size=4), seed=0)
    router.add_replica("a")
    request = RouteRequest("r", digests=[1, 2], num_prompt_tokens=9, num_output_tokens=8)
    router.book(request, "a")
    router.on_routed(request, "a")
    assert router.load_of("a") == 17
    router.report("a", keys={1, 2}, load_tokens=0)  # the report says idle (the request was nearly done)
    router.on_finished("r")  # its 17 tokens finish after the report
    assert router.load_of("a") == 0
    router.check_integrity()


def test_a_hot_prefix_wants_at_most_every_replica():
    traffic = PrefixTraffic(half_life=100.0)
    traffic.track("k")
    traffic.add(["k"], 10.0)  # all the traffic is under k
    assert traffic.replicas_wanted("k", 4, hot_threshold=0.5) == 4
    assert traffic.replicas_wanted("k", 4, hot_threshold=1.0) == 4
    assert traffic.replicas_wanted("other", 4, hot_threshold=0.5) == 1
