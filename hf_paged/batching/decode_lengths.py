"""`PagedConfig(scheduling_policy="remaining")`: a step sized from the running requests' remaining decode lengths.

Today's policy ("budget") admits every prompt the token budget and the free blocks allow *now*; the running
requests then grow into the pool, and when it runs out the scheduler preempts the latest arrival (its K/V is
recomputed or swapped later). "remaining" looks at how long each request may still run (its `max_new_tokens` less
what it generated, an upper bound: EOS and stop strings can end it sooner):

    request tokens   | prompt ............ | output so far | remaining max_new_tokens - 1 |
                     '--- stored now (kv.num_tokens) ---'  '- still to store, at most ----'
                                                           '- horizon -' (its need this step)

  1. admission: the horizon is the shortest remaining tail among the running requests (the steps until the first
     of them can end and give its blocks back). A waiting request starts only when the blocks it needs for its
     prompt and the horizon, plus the blocks every running request needs to reach the horizon (the reserve), fit
     in the free blocks: the pool is not promised past the point where blocks come back. With nothing running
     (and nothing admitted this step) the head of the queue always starts, so nothing waits for good; the first
     admitted then sets the horizon (its own tail). Reserving to every request's last token instead was measured
     too: no preemptions, but 0.87-0.91x the throughput and a 1.09-1.16x p99 on the tight pools;
  2. decodes run shortest remaining tail first, so when the budget or the blocks run short the requests that are
     about to finish (and free their blocks) go first;
  3. when the pool must still give (a prefix hit's copy, a reserve that the budget policy's admissions broke), the
     victim is the request with the longest remaining tail (ties: the latest arrival), not just the latest arrival.

Policy only: the counts come from `KVCacheManager.blocks_needed`; the scheduler calls these at its decision points.
Measured against "budget" in `benchmarks/decode_lengths.py` (results beside it).
"""

from __future__ import annotations

from hf_paged.batching.request import Request
from hf_paged.cache.kv_manager import KVCacheManager


def remaining_new_tokens(request: Request) -> int:
    """Tokens the request may still generate (0 once it reached `max_new_tokens`)."""
    return max(0, request.params.max_new_tokens - len(request.output_ids))


class DecodeLengths:
    """The "remaining" scheduling policy's three decisions over one `KVCacheManager`."""

    def __init__(self, kv: KVCacheManager) -> None:
        self.kv = kv

    @staticmethod
    def order_key(request: Request) -> tuple[bool, int, int, int]:
        """Decodes before prefill chunks; then higher priority, shorter remaining tail, earlier arrival."""
        return (request.num_tokens_to_compute > 1, -request.priority, remaining_new_tokens(request),
                request.arrival_index)

    @staticmethod
    def victim_key(request: Request) -> tuple[int, int, int]:
        """Smallest key is preempted first: lowest priority, then the longest remaining tail, then latest arrival."""
        return (request.priority, -remaining_new_tokens(request), -request.arrival_index)

    @staticmethod
    def horizon(running: list[Request]) -> int | None:
        """Tokens until the first running request can end (its remaining tail) and free its blocks; None when
        nothing runs."""
        return min((remaining_new_tokens(r) for r in running), default=None)

    def need(self, request: Request, horizon: int) -> int:
        """Blocks the request's table still has to take to hold the rest of its prompt and `horizon` more tokens
        (never past its last possible token: the last generated token is sampled, never stored)."""
        rid = request.request_id
        stored = self.kv.num_tokens(rid) if rid in self.kv else 0
        final = len(request.prompt_ids) + request.params.max_new_tokens - 1
        prompt_left = max(0, len(request.prompt_ids) - stored)
        return self.kv.blocks_needed(rid, max(0, min(final - stored, prompt_left + horizon)))

    def reserve(self, running: list[Request]) -> tuple[int | None, int]:
        """(horizon, blocks the running requests need to get there)."""
        horizon = self.horizon(running)
        return horizon, sum(self.need(r, horizon) for r in running) if horizon is not None else 0

    def admits(self, request: Request, horizon: int, reserve: int, *, alone: bool) -> bool:
        """Whether a started (block table registered) waiting request may run: its blocks to the horizon and the
        reserve fit in the free blocks, or it would run alone (nothing running, nothing admitted this step)."""
        return alone or self.need(request, horizon) + reserve <= self.kv.pool.num_free_blocks
