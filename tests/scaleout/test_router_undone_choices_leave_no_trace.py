"""A choice the router undoes (`unbook`: rejected, cancelled, never sent) leaves nothing behind: the blocks it
counted as pending on the replica are no longer believed held there, however many bookings shared them."""

from __future__ import annotations

from hf_paged.scaleout import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest


def _router() -> CacheAwareRouter:
    router = CacheAwareRouter(RouterConfig(block_size=4), seed=0)
    for rid in ("a", "b"):
        router.add_replica(rid)
    return router


def test_an_unbooked_choice_is_no_longer_believed_cached():
    router = _router()
    request = RouteRequest("r1", digests=[1, 2, 3], num_prompt_tokens=13, num_output_tokens=4)
    router.book(request, "a")
    assert router.view_match("a", [1, 2, 3]) == 3  # counted from the choice on
    assert router.unbook("r1")
    assert router.view_match("a", [1, 2, 3]) == 0
    assert router.load_of("a") == 0
    decision = router.route(RouteRequest("r2", digests=[1, 2, 3], num_prompt_tokens=13))
    assert decision.reason is RouteReason.NO_MATCH and decision.num_cached_blocks == 0
    router.check_integrity()


def test_shared_pending_blocks_stay_until_their_last_booking_is_undone():
    router = _router()
    first = RouteRequest("r1", digests=[1, 2, 3], num_prompt_tokens=13)
    second = RouteRequest("r2", digests=[1, 2], num_prompt_tokens=9)
    router.book(first, "a")
    router.book(second, "a")
    assert router.unbook("r2")
    assert router.view_match("a", [1, 2, 3]) == 3  # r1 still counts them
    assert router.unbook("r1")
    assert router.view_match("a", [1, 2, 3]) == 0
    assert router.view_match("a", [1]) == 0
    router.check_integrity()


def test_a_moved_booking_leaves_nothing_on_the_first_replica():
    router = _router()
    request = RouteRequest("r1", digests=[1, 2, 3], num_prompt_tokens=13)
    router.book(request, "a")
    router.book(request, "b")  # chosen again elsewhere: moved
    assert router.view_match("a", [1, 2, 3]) == 0
    assert router.view_match("b", [1, 2, 3]) == 3
    router.on_routed(request, "a")  # but "a" took it: counted there, nothing left pending on "b"
    assert router.view_match("b", [1, 2, 3]) == 0
    assert router.view_match("a", [1, 2, 3]) == 3
    router.check_integrity()
