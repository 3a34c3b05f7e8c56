"""The chat template's constant start (`num_shared_tokens`) is no affinity only up to the last block it fills: a
block that holds the end of the preamble and the start of the conversation differs between conversations, so a
replica holding it does save prefill beyond the shared part (the shared blocks round down, never up)."""

from __future__ import annotations

import pytest

from hf_paged.scaleout import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest


def _route(num_shared_tokens: int):
    router = CacheAwareRouter(RouterConfig(block_size=4, min_gain_share=0.2), seed=0)
    for rid in ("a", "b", "c"):
        router.add_replica(rid)
        router.report(rid, keys={1}, load_tokens=0)  # the preamble's first block: everywhere
    router.report("b", keys={1, 2}, load_tokens=0)  # b also holds the block where this conversation starts
    request = RouteRequest("r", digests=[1, 2, 3, 4], num_prompt_tokens=16, num_shared_tokens=num_shared_tokens)
    return router.route(request)


@pytest.mark.parametrize("shared", [4, 5, 7])
def test_a_block_past_the_whole_shared_blocks_is_affinity(shared):
    decision = _route(shared)  # blocks 0..shared//4 - 1 are shared; b's second block saves 4 of 16 tokens (> 20%)
    assert decision.reason is RouteReason.AFFINITY
    assert decision.replica_ids[0] == "b" and decision.num_cached_blocks == 2


def test_a_match_inside_the_shared_start_is_no_affinity():
    decision = _route(8)  # the shared start covers b's second block too: b saves nothing beyond it
    assert decision.reason is RouteReason.LOW_GAIN
