"""Where a prompt is prefilled under prefill/decode disaggregation: on a prefill replica (its blocks handed over), or
on the decode replica itself, in chunks between its decode steps (conditional disaggregation).

Why. Sending every prompt to the prefill side makes that side a queue: with one prefill replica a short prompt waits
behind every long one while the decode replica, which could have computed it in a few steps, only decodes. The decode
side can take a prompt without hurting its decodes as long as each step carries at most its budget of prompt tokens
(`PagedConfig.max_prefill_tokens_per_step`, which the scheduler applies only while requests decode). So, per request,
the gateway compares how long the prompt would wait for its first token on each side, in one unit (prefill-replica
token-times), from what it sees itself:

    remote = queued_remote / P + u                       the prefill side computes its queue at full speed
    local  = slowdown * B * ceil((queued_local / D + u) / B)   the decode side adds B prompt tokens to each step

    u: the prompt's tokens (the gateway does not see the replicas' caches: both sides count the whole prompt)
    queued_remote / queued_local: tokens of the prompts the gateway placed on that side whose prefill is not done
    P / D: prefill / decode replicas; B: the decode side's prompt budget per step

Local iff local < remote; a prompt with no full block before its last token has nothing to hand over and is local
whatever the queues. `slowdown` is what a prompt token costs when it rides a decode step, relative to a prefill
replica's: a budget B sized for the inter-token target (a step with a full chunk at most 1 + h times a bare decode
step, h = 0.5 for "p99 <= 1.5x p50") means a chunk costs at most h of a decode step, so a step carrying it costs at
least (1 + 1/h) chunks' worth: 3 per token at h = 0.5 (the replay measured ~3.3: a local prompt advanced 16 tokens
per ~50 ms decode step against ~1 ms a token on a prefill replica, `benchmarks/disagg_results.md`). What it does
not see: a decode side about to empty (its budget no longer binds then), so a long prompt that would finish sooner
locally once the decodes end stays on a busy prefill side. No token counts are tuned per workload: the rule is in the
prompt's own length, the queues and the decode side's own budget. Without a budget (B None) a local prefill would
stall every decode in one step: every prompt with a block to hand over goes to the prefill side.

DistServe / Splitwise size the two pools and always split; NVIDIA Dynamo's conditional disaggregation prefills locally
below a fixed prompt length or above a fixed prefill queue length (absolute thresholds). Here both are one comparison.
`PlacementLedger` is the bookkeeping the gateway (`pd_gateway.py`) and the replay (`benchmarks/disagg.py`) share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

__all__ = ["LOCAL_SLOWDOWN", "Placement", "PlacementLedger", "Side", "place_prefill"]

LOCAL_SLOWDOWN = 3.0  # a prompt token in a decode step vs on a prefill replica: 1 + 1/h at h = 0.5 (see above)


class Side(Enum):
    PREFILL = "prefill"  # the prefill replica computes the prompt; the decode replica loads its blocks
    LOCAL = "local"  # the decode replica computes the prompt itself (chunked by its budget)


@dataclass(frozen=True, slots=True)
class Placement:
    """The decision for one prompt and what it was made from (token-times on a prefill replica)."""

    side: Side
    num_tokens: int  # the prompt's tokens (u): what the ledger books on `side` until its prefill is done
    remote_cost: float  # estimated wait for the first token on the prefill side
    local_cost: float  # ... on the decode side (inf without a budget)
    handover: bool  # the prompt has a full block before its last token (something to hand over)


def place_prefill(num_tokens: int, *, block_size: int, queued_remote: int, queued_local: int,
                  local_budget: int | None, num_prefill_replicas: int = 1, num_decode_replicas: int = 1,
                  slowdown: float = LOCAL_SLOWDOWN) -> Placement:
    """The side that gives `num_tokens` of prompt its first token sooner (module docstring); a pure function."""
    if num_tokens < 0 or queued_remote < 0 or queued_local < 0:
        raise ValueError(f"token counts must be >= 0, got prompt {num_tokens}, queued remote {queued_remote}, "
                         f"queued local {queued_local}")
    if block_size < 1 or num_prefill_replicas < 1 or num_decode_replicas < 1:
        raise ValueError(f"block_size and replica counts must be >= 1, got {block_size}, {num_prefill_replicas}, "
                         f"{num_decode_replicas}")
    if local_budget is not None and local_budget < 1:
        raise ValueError(f"local_budget (the decode side's max_prefill_tokens_per_step) must be >= 1 or None, "
                         f"got {local_budget}")
    if slowdown < 1:
        raise ValueError(f"slowdown must be >= 1 (a token in a decode step is never cheaper), got {slowdown}")
    handover = (num_tokens - 1) // block_size >= 1  # the block holding the last token never travels
    remote = queued_remote / num_prefill_replicas + num_tokens
    local = math.inf
    if local_budget is not None:
        steps = math.ceil((queued_local / num_decode_replicas + num_tokens) / local_budget)
        local = slowdown * local_budget * steps
    side = Side.LOCAL if not handover or local < remote else Side.PREFILL
    return Placement(side, num_tokens, remote, local, handover)


class PlacementLedger:
    """The tokens placed on each side whose prefill is not done yet, and the decisions made from them.

    `place` decides and books; `done` releases a placement once (its prefill answered, or its first answer bytes
    came back from the decode side, or it failed). Counters: placements per side and how many had no block to hand
    over. One owner: the gateway's event loop (or the replay's loop); no lock.
    """

    def __init__(self, *, block_size: int, local_budget: int | None, num_prefill_replicas: int = 1,
                 num_decode_replicas: int = 1, slowdown: float = LOCAL_SLOWDOWN) -> None:
        self.block_size, self.local_budget, self.slowdown = block_size, local_budget, slowdown
        self.num_prefill_replicas, self.num_decode_replicas = num_prefill_replicas, num_decode_replicas
        self.queued = {Side.PREFILL: 0, Side.LOCAL: 0}
        self.num_placed = {Side.PREFILL: 0, Side.LOCAL: 0}
        self.num_no_handover = 0  # placed local because nothing could be handed over

    def place(self, num_tokens: int) -> Placement:
        placement = place_prefill(
            num_tokens, block_size=self.block_size, queued_remote=self.queued[Side.PREFILL],
            queued_local=self.queued[Side.LOCAL], local_budget=self.local_budget,
            num_prefill_replicas=self.num_prefill_replicas, num_decode_replicas=self.num_decode_replicas,
            slowdown=self.slowdown)
        self.queued[placement.side] += num_tokens
        self.num_placed[placement.side] += 1
        self.num_no_handover += not placement.handover
        return placement

    def done(self, placement: Placement) -> None:
        """Release a placement's tokens (call once per placement)."""
        left = self.queued[placement.side] - placement.num_tokens
        if left < 0:
            raise ValueError(f"{placement.side.value} side: releasing {placement.num_tokens} tokens with only "
                             f"{self.queued[placement.side]} booked (a placement released twice?)")
        self.queued[placement.side] = left

    def check_integrity(self) -> None:
        assert all(n >= 0 for n in self.queued.values()), self.queued
