"""Per-request records of a simulated run, for two questions of issue 37 (`benchmarks/routing_sim_choices.py`):

1. Where do ours' and Ray's router's choices differ, and what does each difference cost? `attribute` pairs the two
   runs' requests (same workload and seed: the same session and turn) and charges the hit tokens ours gets minus
   Ray's to the rule that made ours' choice, read from what the router saw:

       at the deepest true holder            | the choice was the best any replica's true cache allowed
       <reason>: ... missing from the view   | the router believed the deepest true holder held no more than
                                             | the replica it chose (its report was behind)
       <reason>: ... past a bound / lightest | the router saw the deeper holder and its rule chose another

2. Can max/mean work reach the target on a trace? `work_bounds` takes each request's work (prompt less its hit +
   output) as ours' run had it and asks what other assignments of the same work reach: offline (any order: longest
   first, LPT), offline keeping ours' hits (requests that reused blocks stay with the requests that computed them),
   and online in arrival order (each request to the replica with the least work so far, knowing its exact work).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass

from benchmarks.routing.replica import Replica, SimRequest

__all__ = ["AttributionRow", "Choice", "LargeRequest", "WorkBounds", "attribute", "lpt_max", "recorded",
           "work_bounds"]

SHORT_TOKENS = 4096  # a prompt below this is "short" in the tables (the synthetic short prompts stay under it)


@dataclass(slots=True)
class Choice:
    """One routed request of a run, as it ended."""

    session: int
    turn: int
    arrival: float
    num_prompt_tokens: int
    num_output_tokens: int
    hit_tokens: int  # served from the chosen replica's prefix cache
    replica: int
    reason: str  # ours' `RouteReason` value; "" for other policies
    best_blocks: int  # the deepest true cached prefix on any replica at the choice
    chosen_blocks: int  # ... on the chosen replica
    view_best_blocks: int  # ours: what the router believed the deepest true holder held (-1: other policies)
    view_chosen_blocks: int  # ours: ... the chosen replica held
    ttft_s: float
    keys: list[int]  # the prompt's block keys (for the groups of `work_bounds`)

    @property
    def work_tokens(self) -> int:
        """Tokens the replica computed for it: the uncached prompt and every output token but the first (computed
        by the last prefill step), as `Replica.finish_step` counts them."""
        return self.num_prompt_tokens - self.hit_tokens + self.num_output_tokens - 1


def recorded(policy_cls: type) -> type:
    """A subclass of a simulator policy that records a `Choice` per request (in `choices`, in finishing order)."""

    class Recorded(policy_cls):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self.choices: list[Choice] = []
            self._seen: dict[int, tuple[int, int, int, int, str]] = {}

        def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
            cached = [r.cached_blocks(request.keys) for r in replicas]
            index = super().choose(request, replicas)
            deepest = max(range(len(cached)), key=lambda i: (cached[i], i == index))  # the chosen one on ties
            view_best = view_chosen = -1
            reason = ""
            router = getattr(self, "router", None)
            if router is not None:
                view_best = router.view_match(deepest, request.keys)
                view_chosen = router.view_match(index, request.keys)
                reason = request.route[1].reason.value
            self._seen[request.rid] = (cached[deepest], cached[index], view_best, view_chosen, reason)
            return index

        def finished(self, request: SimRequest) -> None:
            if hasattr(super(), "finished"):
                super().finished(request)
            best, chosen, view_best, view_chosen, reason = self._seen.pop(request.rid)
            self.choices.append(Choice(
                request.session, request.turn, request.arrival, request.num_prompt_tokens,
                request.num_output_tokens, request.hit_tokens, request.replica, reason, best, chosen, view_best,
                view_chosen, request.first_token - request.arrival, request.keys))

    Recorded.__name__ = Recorded.__qualname__ = policy_cls.__name__
    return Recorded


@dataclass(slots=True)
class AttributionRow:
    rule: str  # what made ours' choice (module docstring)
    prompts: str  # "short" or "long" (`SHORT_TOKENS`)
    num_requests: int
    hit_tokens_diff: int  # ours - Ray's, summed over these requests
    points: float  # that, in points of the measured prompt tokens' hit rate
    mean_ttft_ours_s: float
    mean_ttft_theirs_s: float


_SEEN = {"affinity": "the deepest holder past a bound, a shallower one taken",
         "hot_spread": "the deepest holder past a bound, a shallower one taken",
         "imbalanced": "every holder past a bound, the lightest less its saving taken",
         "low_gain": "the match < 20% of the prompt, the lightest less its saving taken"}


def _rule(c: Choice) -> str:
    if c.chosen_blocks >= c.best_blocks:
        return "at the deepest true holder"
    if c.view_best_blocks < c.best_blocks and c.view_best_blocks <= c.view_chosen_blocks:
        return f"{c.reason}: the deepest holder's blocks missing from the router's view"
    return f"{c.reason}: {_SEEN.get(c.reason, 'the deepest holder not taken')}"


def attribute(ours: list[Choice], theirs: list[Choice], warmup: float = 0.1) -> list[AttributionRow]:
    """Ours' hit tokens minus theirs, request by request (same session and turn), by the rule behind ours' choice;
    requests arriving in the first `warmup` share of the window are not measured, as in the simulator's metrics.
    Rows: largest loss first."""
    by_turn = {(c.session, c.turn): c for c in theirs}
    first, last = min(c.arrival for c in ours), max(c.arrival for c in ours)
    warm = first + warmup * (last - first)
    groups: dict[tuple[str, str], list[tuple[Choice, Choice]]] = defaultdict(list)
    prompt_tokens = 0
    for c in ours:
        other = by_turn.get((c.session, c.turn))
        if other is None or c.arrival < warm:
            continue
        prompt_tokens += c.num_prompt_tokens
        groups[(_rule(c), "short" if c.num_prompt_tokens < SHORT_TOKENS else "long")].append((c, other))
    rows = []
    for (rule, prompts), pairs in groups.items():
        diff = sum(a.hit_tokens - b.hit_tokens for a, b in pairs)
        rows.append(AttributionRow(rule, prompts, len(pairs), diff, 100 * diff / max(1, prompt_tokens),
                                   sum(a.ttft_s for a, _ in pairs) / len(pairs),
                                   sum(b.ttft_s for _, b in pairs) / len(pairs)))
    return sorted(rows, key=lambda r: r.hit_tokens_diff)


def lpt_max(jobs: list[int], num_replicas: int) -> int:
    """The busiest replica's work when `jobs` go longest first, each to the least loaded replica (Graham's LPT:
    within 4/3 of the best assignment)."""
    loads = [0] * num_replicas
    for job in sorted(jobs, reverse=True):
        heapq.heapreplace(loads, loads[0] + job)
    return max(loads)


@dataclass(slots=True)
class LargeRequest:
    """A request of at least `LARGE_SHARE` of the mean replica's work, at its arrival (all in mean replica works)."""

    arrival_share: float  # its place among the arrivals, 0-1
    work: float
    lightest_ours: float  # the least work any replica had computed for earlier arrivals, in ours' run
    mean_then: float  # the mean replica's work for earlier arrivals
    lightest_greedy: float  # the same, for the online greedy assignment
    room: float  # the most work a replica may hold then for the target: target - work


LARGE_SHARE = 0.3


@dataclass(slots=True)
class WorkBounds:
    num_replicas: int
    mean_work: float  # tokens
    ours: float  # max/mean work of ours' run (the same per-request work)
    largest_request: float  # the largest request's work / the mean replica's
    offline_lpt: float  # max/mean of LPT over the requests
    num_groups: int  # requests joined by reused blocks (module docstring)
    largest_group: float  # the largest group's work / the mean replica's
    offline_groups_lpt: float  # max/mean of LPT over the groups: ours' hits kept
    online_greedy: float  # max/mean, arrival order, each to the replica with the least work so far
    large: list[LargeRequest]


def work_bounds(choices: list[Choice], num_replicas: int, block_size: int, target: float = 1.25) -> WorkBounds:
    """What assignments of ours' per-request work reach (module docstring). Requests count as ours' replicas
    computed them (warm-up included, as the run's max/mean work)."""
    by_arrival = sorted(choices, key=lambda c: c.arrival)
    works = [c.work_tokens for c in by_arrival]
    mean = sum(works) / num_replicas
    ours = defaultdict(int)
    for c, w in zip(by_arrival, works):
        ours[c.replica] += w
    # Groups: a request that reused blocks on its replica joins the requests that computed those blocks there
    parent = list(range(len(by_arrival)))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    computed_by: dict[int, dict[int, int]] = defaultdict(dict)  # replica -> block key -> the request computing it
    for i, c in enumerate(by_arrival):
        held = computed_by[c.replica]
        reused = c.hit_tokens // block_size
        for j in {held[k] for k in c.keys[:reused] if k in held}:
            parent[find(i)] = find(j)
        for key in c.keys[reused:]:
            held[key] = i
    group_work: dict[int, int] = defaultdict(int)
    for i, w in enumerate(works):
        group_work[find(i)] += w
    greedy = [0] * num_replicas  # a heap of loads
    seen = [0] * num_replicas
    large = []
    for i, (c, w) in enumerate(zip(by_arrival, works)):
        if w >= LARGE_SHARE * mean:
            large.append(LargeRequest(i / len(works), w / mean, min(seen) / mean, sum(seen) / num_replicas / mean,
                                      greedy[0] / mean, target - w / mean))
        seen[c.replica] += w
        heapq.heapreplace(greedy, greedy[0] + w)
    groups = list(group_work.values())
    return WorkBounds(num_replicas, mean, max(ours.values()) / mean, max(works) / mean,
                      lpt_max(works, num_replicas) / mean, len(groups), max(groups) / mean,
                      lpt_max(groups, num_replicas) / mean, max(greedy) / mean, large)


def run_recorded(simulate: Callable, policy_cls: type, *args, **kwargs) -> tuple[object, list[Choice]]:
    """`simulate(recorded(policy_cls), ...)`: the run's result and its choices."""
    cls = recorded(policy_cls)
    holder: list = []

    class Capturing(cls):
        def __init__(self, *a, **k) -> None:
            super().__init__(*a, **k)
            holder.append(self)

    Capturing.__name__ = Capturing.__qualname__ = policy_cls.__name__
    result = simulate(Capturing, *args, **kwargs)
    return result, holder[0].choices
