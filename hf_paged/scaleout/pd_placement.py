"""Where a prompt is prefilled under prefill/decode disaggregation: on a prefill replica (its blocks handed over), or
on the decode replica itself, in chunks between its decode steps (conditional disaggregation).

Why. Sending every prompt to the prefill side makes that side a queue: with one prefill replica a short prompt waits
behind every long one while the decode replica, which could have computed it in a few steps, only decodes. The decode
side can take a prompt without hurting its decodes as long as each step carries at most its budget of prompt tokens
(`PagedConfig.max_prefill_tokens_per_step`, which the scheduler applies only while requests decode). So, per request,
the gateway compares how long the prompt would wait for its first token on each side, in one unit (prefill-replica
token-times), from what it sees itself:

    remote = queued_remote / P + u                                   the prefill side computes its queue at full speed
    local  = slowdown * B * ceil(w / B)       if slowdown * w <= drain   the decodes bound every step until it is done
           = drain + w - drain / slowdown     otherwise                  full speed once nothing decodes
    w = queued_local / D + u

    u: the prompt's tokens (the gateway does not see the replicas' caches: both sides count the whole prompt)
    queued_remote / queued_local: tokens of the prompts the gateway placed on that side whose prefill is not done
    P / D: prefill / decode replicas; B: the decode side's prompt budget per step
    drain: token-times until the decode side has nothing left to decode (its budget no longer binds then): its
        longest booked decode (new tokens asked), a step each, each step `step_ratio` decode-only steps, a decode-only
        step in prefill token-times as the replicas measure it (`decode_step_tokens`); unknown: for ever

Local iff local < remote; a prompt with no full block before its last token has nothing to hand over and is local
whatever the queues. `slowdown` is what a prompt token costs when it rides a decode step, relative to a prefill
replica's. With steps sized by time (the decode side's `max_prefill_step_time_ratio` r: a step that carries a chunk
takes at most r decode-only steps, the chunk r - 1 of them) it is r / (r - 1) (`slowdown_for`: 3 at 1.5, ~3.9 at
1.35); sized by tokens, B is taken to be sized for the same bound at 1.5, so 3 (the replay measured ~3.3: a local
prompt advanced 16 tokens per ~50 ms decode step against ~1 ms a token on a prefill replica,
`benchmarks/disagg_results.md`). The drain matters for long prompts: bounded for ever, a long prompt is local only
behind a prefill queue slowdown - 1 times its length; with the decodes about to end it finishes sooner locally, and
that is where TTFT p99 came from (the last long prompt queued behind the one prefill replica while the decode side
could have taken it). The drain counts no progress (it over-counts: fewer prompts go local than could). No token
counts are tuned per workload: the rule is in the prompt's own length, the queues, the decode side's own budget and
measured step times. Without a budget (B None) a local prefill would stall every decode in one step: every prompt
with a block to hand over goes to the prefill side.

DistServe / Splitwise size the two pools and always split; NVIDIA Dynamo's conditional disaggregation prefills locally
below a fixed prompt length or above a fixed prefill queue length (absolute thresholds). Here both are one comparison.
`PlacementLedger` is the bookkeeping the gateway (`pd_gateway.py`) and the replay (`benchmarks/disagg.py`) share.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import Enum

__all__ = ["LOCAL_SLOWDOWN", "Placement", "PlacementLedger", "Side", "place_prefill", "slowdown_for"]

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


def slowdown_for(ratio: float) -> float:
    """A prompt token's cost in a decode step against a prefill replica's when steps are sized by time: a step that
    carries a chunk takes `ratio` decode-only steps, the chunk `ratio - 1` of them, so per chunk token the decode
    side spends ratio / (ratio - 1) of the token's own cost (3 at 1.5, ~3.9 at 1.35)."""
    if not 1 < ratio < math.inf:
        raise ValueError(f"a step-time ratio must be finite and > 1, got {ratio!r}")
    return ratio / (ratio - 1)


def place_prefill(num_tokens: int, *, block_size: int, queued_remote: int, queued_local: int,
                  local_budget: int | None, num_prefill_replicas: int = 1, num_decode_replicas: int = 1,
                  slowdown: float = LOCAL_SLOWDOWN, drain: float = math.inf) -> Placement:
    """The side that gives `num_tokens` of prompt its first token sooner (module docstring); a pure function."""
    if not all(0 <= n < math.inf for n in (num_tokens, queued_remote, queued_local)):  # (NaN fails too: one NaN
        # booked on a side made every later comparison false, and every later prompt went to the prefill side)
        raise ValueError(f"token counts must be finite and >= 0, got prompt {num_tokens}, queued remote "
                         f"{queued_remote}, queued local {queued_local}")
    if block_size < 1 or num_prefill_replicas < 1 or num_decode_replicas < 1:
        raise ValueError(f"block_size and replica counts must be >= 1, got {block_size}, {num_prefill_replicas}, "
                         f"{num_decode_replicas}")
    if local_budget is not None and not 1 <= local_budget < math.inf:
        raise ValueError(f"local_budget (the decode side's max_prefill_tokens_per_step) must be a finite number "
                         f">= 1 or None, got {local_budget}")
    if not 1 <= slowdown < math.inf:
        raise ValueError(f"slowdown must be >= 1 (a token in a decode step is never cheaper), got {slowdown}")
    if not drain >= 0:
        raise ValueError(f"drain (token-times until the decode side stops decoding) must be >= 0, got {drain}")
    handover = (num_tokens - 1) // block_size >= 1  # the block holding the last token never travels
    remote = queued_remote / num_prefill_replicas + num_tokens
    local = math.inf
    if local_budget is not None:
        work = queued_local / num_decode_replicas + num_tokens
        if work * slowdown <= drain:  # done while the decodes bound every step
            local = slowdown * local_budget * math.ceil(work / local_budget)
        else:  # what the bounded steps leave, at a prefill replica's speed once nothing decodes
            local = drain + work - drain / slowdown
    side = Side.LOCAL if not handover or local < remote else Side.PREFILL
    return Placement(side, num_tokens, remote, local, handover)


class PlacementLedger:
    """The tokens placed on each side whose prefill is not done yet, and the decisions made from them.

    `place` decides and books; `done` releases a placement once (its prefill answered, or its first answer bytes
    came back from the decode side, or it failed). Counters: placements per side and how many had no block to hand
    over. One owner: the gateway's event loop (or the replay's loop); no lock.
    """

    def __init__(self, *, block_size: int, local_budget: int | None, num_prefill_replicas: int = 1,
                 num_decode_replicas: int = 1, step_ratio: float | None = None) -> None:
        self.block_size, self.local_budget = block_size, local_budget
        # the decode side's steps sized by time (its max_prefill_step_time_ratio), else by tokens at h = 0.5
        self.slowdown = slowdown_for(step_ratio) if step_ratio is not None else LOCAL_SLOWDOWN
        self.num_prefill_replicas, self.num_decode_replicas = num_prefill_replicas, num_decode_replicas
        self.queued = {Side.PREFILL: 0, Side.LOCAL: 0}
        self.num_placed = {Side.PREFILL: 0, Side.LOCAL: 0}
        self.num_no_handover = 0  # placed local because nothing could be handed over
        # a decode step's time in prefill-replica token-times, as the replicas measured it (`StepTimes.decode_step`
        # over the prefill side's seconds a token); None: unknown, the decode side is taken to decode for ever
        self.decode_step_tokens: float | None = None
        self._decoding: list[int] = []  # new tokens asked by each request the decode side answers, not yet ended

    def start_decode(self, max_new_tokens: int) -> None:
        """A request went to the decode side (after its own placement): it decodes up to `max_new_tokens`."""
        if max_new_tokens < 0:
            raise ValueError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
        self._decoding.append(max_new_tokens)

    def end_decode(self, max_new_tokens: int) -> None:
        """A request the decode side answered ended (call once per `start_decode`, with the same count)."""
        try:
            self._decoding.remove(max_new_tokens)
        except ValueError:
            raise ValueError(f"no decode of {max_new_tokens} new tokens is booked (ended twice?)") from None

    def drain(self) -> float:
        """Token-times until the decode side stops decoding (its budget then no longer binds): the longest booked
        decode, a step each, every step carrying a chunk (step_ratio decode-only steps). Progress is not seen, so
        this over-counts: a prompt is kept local only where the bound steps alone would not leave it late."""
        if self.decode_step_tokens is None:
            return math.inf
        step_ratio = self.slowdown / (self.slowdown - 1)  # (the inverse of slowdown_for)
        return max(self._decoding, default=0) * step_ratio * self.decode_step_tokens

    def place(self, num_tokens: int) -> Placement:
        placement = place_prefill(
            num_tokens, block_size=self.block_size, queued_remote=self.queued[Side.PREFILL],
            queued_local=self.queued[Side.LOCAL], local_budget=self.local_budget,
            num_prefill_replicas=self.num_prefill_replicas, num_decode_replicas=self.num_decode_replicas,
            slowdown=self.slowdown, drain=self.drain())
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
