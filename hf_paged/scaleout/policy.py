"""Cache-aware routing: a pure policy object (no Ray, no clock, no I/O); the Ray adapter is a few lines around it.

Inputs: each replica's reported cache summary and load, what this router sent since, and the request's chained
block fingerprints. Output: a ranked list of replicas. Every bound is relative (no knob in tokens). For one request
of P prompt tokens:

    match(r)  = the request's leading blocks replica r holds (last report | sent there in the last 2 periods |
                chosen for it and not yet accepted)
    shared    = the deeper of: the match that (nearly) every candidate has (`shared_share` of them), and the
                request's `num_shared_tokens` (a chat template's constant start, found by the gateway): a preamble
    gain(r)   = prefill r saves beyond the shared part: min(match(r) * block_size, P) - min(shared * block_size, P)
    affine(r) = gain(r) >= min_gain_share * P                  (a match worth something)
    fits(r)   = load(r) <= mean load + queue_factor * gain(r) + mean request        (queueing vs prefill saved)
                and work(r) <= balance_factor * mean work + mean request            (long run: decayed work)
    key       = the request's block at the deepest match;  wanted = replicas its share of recent work calls for

    nobody matches                              -> the lightest replica                         NO_MATCH
    no replica is affine                        -> the lightest, less what each one's match     LOW_GAIN
                                                   saves beyond the shared part
    the key's holders < wanted and the lightest
      other is lighter than the fitting ones
      (every affine one when none fits), less
      the prefill each one's match saves        -> that replica (it joins the key)              HOT_ADMIT
    some affine replica fits                    -> the fitting one that saves most              AFFINITY / HOT_SPREAD
    otherwise                                   -> the affine ones and 4 random others: the     IMBALANCED
                                                   lightest less what its match saves

"Mean request" is the decayed mean work of a routed request (uncached prompt + output budget), so one default holds
for 500-token and 30k-token prompts: a holder may run one request ahead of the candidates' mean load, plus
queue_factor times what its match saves (the mean, not the lightest: the lightest of 100 replicas is near idle, so
a bound on it tightens as the cluster grows). The work bound is consistent hashing with bounded loads (Mirrokni et
al.): queued tokens are near zero everywhere in a lightly loaded cluster, so the queue test alone lets sticky
affinity pile work on the replicas that caught popular prefixes; bounding the decayed work a replica was sent keeps
max/mean near `balance_factor`, and a prefix that overflows its holders gains another (IMBALANCED). A shared
preamble is never a key, so it is neither affinity nor hot.

Load is in tokens (prompt still to compute + output budget): the replica's last report, plus what this router sent
since (its uncached part), minus what finished since (`replica_view.py`).

"Lightest" is by weight (decayed work + load, tokens): for NO_MATCH and LOW_GAIN over every candidate (one router
counts each choice at once, `book`, so the lightest moves as it routes; 4 random ones would leave a replica that drew
a 100k-token prompt among the draws 1 time in 25 at 100 replicas). Long prompts (Mooncake's synthetic trace at 100
replicas: up to 191k tokens, 0.7x a replica's mean work, 36 requests a replica) set three rules: an IMBALANCED
choice weighs every drawn replica less the prefill its match saves, holders included (recomputing a long prompt
elsewhere only moves the imbalance); a hot prefix admits a replica only when it is lighter even after recomputing
what the holders have, whether or not a holder fits (one past a bound still saves its match: a 191k-token prompt
recomputed by an admitted replica was the busiest replica's largest request); and a prefix's traffic is what its
requests cost at its holders (beyond the deepest match), so admitting a replica, which recomputes the prefix, does
not make the prefix look hotter.

A choice counts from the moment it is made (`book`: its blocks as pending on the replica, its load and work), so
requests routed while the replica has not yet accepted it see it; `on_routed` confirms it (or moves it, when the
request went to another replica), `unbook` undoes it exactly (rejected, cancelled, never sent). Exact ties between
replicas go to a random one (the router's seeded draws), not always to the first.
"""

from __future__ import annotations

import heapq
import math
import random
from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Sequence

from hf_paged.scaleout.replica_view import ReplicaView
from hf_paged.scaleout.routing_types import Booking, RouterConfig, RouteReason, RouteRequest, RoutingDecision
from hf_paged.scaleout.traffic import PrefixTraffic

__all__ = ["CacheAwareRouter", "RouteReason", "RouteRequest", "RouterConfig", "RoutingDecision"]


_RESCALE_AT = 1e100
NUM_CHOICES = 4  # replicas offered when routing by load (the lightest first: the rest are fallbacks)


class CacheAwareRouter:
    """Routes a request to the replica whose cache saves it the most prefill, within load bounds; spreads hot
    prefixes.

    Args:
        config: relative thresholds (see `RouterConfig`).
        seed: seed of the random draws; the same calls with the same seed give the same choices.

    Example:
        >>> router = CacheAwareRouter(RouterConfig(block_size=4), seed=0)
        >>> router.add_replica("a"); router.add_replica("b")
        >>> _ = router.report("b", keys={11, 12}, load_tokens=0)
        >>> request = RouteRequest("r1", digests=[11, 12, 13], num_prompt_tokens=13)
        >>> decision = router.route(request)
        >>> decision.replica_ids[0], decision.reason.value, decision.num_cached_blocks
        ('b', 'affinity', 2)
    """

    def __init__(self, config: RouterConfig | None = None, *, seed: int | None = 0) -> None:
        self.config = config or RouterConfig()
        self._rng = random.Random(seed)
        self._replicas: dict[Hashable, ReplicaView] = {}
        self._pool: list[ReplicaView] | None = None  # list(self._replicas.values()), rebuilt after membership changes
        self._inflight: dict[Hashable, Booking] = {}  # request id -> where it is counted (chosen or accepted)
        # Decayed work without touching every replica per request: each request's credit is inflated by the
        # growth factor over the previous one; comparisons are ratios, and everything is rescaled before overflow.
        self._unit = 1.0
        self._total_work = 0.0
        self._total_requests = 0.0  # decayed count of routed requests, same units: mean request = work / this
        self.traffic = PrefixTraffic(self.config.traffic_half_life)
        self.num_routed: Counter[RouteReason] = Counter()

    # -- membership and reports --------------------------------------------------------------------------
    @property
    def replica_ids(self) -> list[Hashable]:
        return list(self._replicas)

    def add_replica(self, replica_id: Hashable) -> None:
        """Make a replica routable (no-op if known). It starts with no summary, no load and no work."""
        if replica_id not in self._replicas:
            self._replicas[replica_id] = ReplicaView(replica_id)
            self._pool = None

    def remove_replica(self, replica_id: Hashable) -> None:
        """Forget a replica at once: its summary, what was sent to it, its work and in-flight requests."""
        replica = self._replicas.pop(replica_id, None)
        if replica is not None:
            self._pool = None
            self._total_work = max(0.0, self._total_work - replica.work)
            self._inflight = {rid: b for rid, b in self._inflight.items() if b.replica_id != replica_id}

    def sync_replicas(self, replica_ids: Iterable[Hashable]) -> None:
        """Make the known set exactly `replica_ids` (adds new ones, forgets missing ones)."""
        wanted = list(replica_ids)
        for gone in set(self._replicas) - set(wanted):
            self.remove_replica(gone)
        for replica_id in wanted:
            self.add_replica(replica_id)

    def report(self, replica_id: Hashable, *, keys: Collection[Hashable], load_tokens: int) -> bool:
        """Take a replica's report (its cached fingerprints and queued + running tokens).

        Returns False, changing nothing, for an unknown replica: a late report from a removed replica must not
        bring it back.
        """
        replica = self._replicas.get(replica_id)
        if replica is None:
            return False
        replica.take_report(keys if isinstance(keys, frozenset) else frozenset(keys), load_tokens)
        return True

    def apply_events(self, replica_id: Hashable, kinds: Sequence[int], keys: Sequence[Hashable]) -> bool:
        """Apply a replica's block events since its last report, in order (`ReplicaView.apply_events`): the
        caller applies each event once, after the report it follows. False, changing nothing, for an unknown
        replica."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return False
        replica.apply_events(kinds, keys)
        return True

    def load_of(self, replica_id: Hashable) -> int:
        """The router's estimate of a replica's queued + running tokens."""
        return self._replicas[replica_id].load

    def view_match(self, replica_id: Hashable, digests: Sequence[Hashable]) -> int:
        """Leading `digests` the router believes `replica_id` holds (reported | sent | pending)."""
        return self._replicas[replica_id].match(digests)

    def work_share(self, replica_id: Hashable) -> float:
        """The replica's share of the recent (decayed) work routed by this router; 0 before any routing."""
        return self._replicas[replica_id].work / self._total_work if self._total_work > 0 else 0.0

    @property
    def mean_request_tokens(self) -> float:
        """The decayed mean work of a routed request (uncached prompt + output budget): the bounds' unit."""
        return self._total_work / self._total_requests if self._total_requests > 0 else 0.0

    def replica_stats(self, replica_id: Hashable) -> dict[str, float]:
        """The router's view of one replica (for debugging and metrics)."""
        replica = self._replicas[replica_id]
        return {"load_tokens": replica.load, "work_share": round(self.work_share(replica_id), 4),
                "num_reports": replica.num_reports, "num_fingerprints": len(replica.keys),
                "num_events": replica.num_events}

    # -- routing -----------------------------------------------------------------------------------------
    def route(self, request: RouteRequest, candidates: Iterable[Hashable] | None = None) -> RoutingDecision:
        """Rank the known `candidates` (default: every known replica) for `request`. Changes no state but the
        random draws; call `book` with the first choice at once (so the next choices see it), then `on_routed`
        with the replica that took the request (or only `on_routed`, when nothing is routed in between)."""
        cfg = self.config
        pool = self._candidates(candidates)
        digests = request.digests
        first = digests[0] if digests else None
        matches = [r.match(digests) if first in r.keys or first in r.sent or first in r.sent_before
                   or first in r.pending else 0 for r in pool]
        best = max(matches)
        if best == 0:
            return self._decide(self._choices(pool), RouteReason.NO_MATCH, None, 1, digests)
        prompt = max(1, request.num_prompt_tokens)
        # The match (nearly) every candidate has: k-th deepest, k = ceil(shared_share * candidates)
        k = max(1, math.ceil(cfg.shared_share * len(pool) - 1e-9))
        shared_blocks = max(sorted(matches, reverse=True)[k - 1], request.num_shared_tokens // cfg.block_size)
        shared = min(shared_blocks * cfg.block_size, prompt)
        gains = [min(m * cfg.block_size, prompt) - shared for m in matches]
        floor = max(1e-9, cfg.min_gain_share * prompt)
        affine = [(r, g) for r, g in zip(pool, gains) if g >= floor]
        by_gain = dict(zip(pool, gains))
        if not affine:
            return self._decide(self._choices(pool, by_gain), RouteReason.LOW_GAIN, None, 1, digests)
        key = digests[best - 1]
        wanted = self.traffic.replicas_wanted(key, len(self._replicas), cfg.hot_threshold)
        fitting = self._fitting(affine, pool)
        holders = sum(m == best for m in matches)
        saved = {r: min(m * cfg.block_size, prompt) for r, m in zip(pool, matches)}  # prefill each one saves
        if holders < wanted:
            others = [r for r, m in zip(pool, matches) if m < best]
            if others:
                newcomer = self._choices(others)[0]
                after = self._weight(newcomer) - saved[newcomer]  # lighter even after computing what holders have
                if after < min(self._weight(r) - saved[r] for r, _ in (fitting or affine)):
                    ranked = [newcomer, *(r for r, _ in fitting)]
                    return self._decide(ranked, RouteReason.HOT_ADMIT, key, wanted, digests)
        if fitting:
            reason = RouteReason.HOT_SPREAD if wanted > 1 else RouteReason.AFFINITY
            if len(fitting) > 1:
                self._rng.shuffle(fitting)  # exact ties at random (the sort is stable)
            fitting.sort(key=lambda rg: (-rg[1], rg[0].load, self._weight(rg[0])))  # most saved, then lightest
            ranked = [r for r, _ in fitting[:2]]
            return self._decide([*ranked, *self._choices(pool)], reason, key, wanted, digests)
        # Past a bound: the affine replicas against NUM_CHOICES random others, the lightest after taking it first
        drawn = dict.fromkeys([*(r for r, _ in affine), *self._rng.sample(pool, min(len(pool), NUM_CHOICES))])
        ranked = sorted(drawn, key=lambda r: self._weight(r) - saved[r])
        return self._decide(ranked, RouteReason.IMBALANCED, key, wanted, digests)

    def book(self, request: RouteRequest, replica_id: Hashable) -> None:
        """Count `request` on `replica_id` from now, before the replica accepted it: its blocks as pending there,
        its load and work added. A request booked already is moved. `on_routed` confirms it, `unbook` undoes it."""
        self.unbook(request.request_id)
        replica = self._replicas.get(replica_id)
        if replica is not None:
            self._book(request, replica, confirmed=False)

    def _book(self, request: RouteRequest, replica: ReplicaView, *, confirmed: bool) -> Booking:
        added = self._work_of(request, replica.match(request.digests))
        if confirmed:
            replica.sent.update(request.digests)
        else:
            replica.add_pending(request.digests)
        replica.sent_since_report += added
        replica.refresh_load()
        self._unit *= 2.0 ** (1.0 / (self.config.balance_half_life * max(1, len(self._replicas))))
        credit = added * self._unit
        replica.work += credit
        self._total_work += credit
        self._total_requests += self._unit
        booking = Booking(replica.replica_id, request.digests, added, credit, self._unit, confirmed)
        self._inflight[request.request_id] = booking
        if self._unit > _RESCALE_AT:
            self._rescale()
        return booking

    def unbook(self, request_id: Hashable) -> bool:
        """Undo a booking not yet confirmed (the request was rejected, cancelled or never sent): its pending
        blocks, load and work. False, changing nothing, when there is none (unknown, or confirmed already)."""
        booking = self._inflight.get(request_id)
        if booking is None or booking.confirmed:
            return False
        del self._inflight[request_id]
        replica = self._replicas.get(booking.replica_id)
        if replica is not None:
            replica.drop_pending(booking.digests)
            replica.finished_since_report += booking.added
            replica.refresh_load()
            replica.work = max(0.0, replica.work - booking.credit)
            self._total_work = max(0.0, self._total_work - booking.credit)
            self._total_requests = max(0.0, self._total_requests - booking.unit)
        return True

    def on_routed(self, request: RouteRequest, replica_id: Hashable, decision: RoutingDecision | None = None) -> None:
        """Record that `replica_id` took `request`: its prefix counts as cached there from now, its work as added.
        Confirms the request's booking (`book`), moving it first if it was booked on another replica."""
        replica = self._replicas.get(replica_id)
        booking = self._inflight.get(request.request_id)
        if booking is not None and booking.confirmed:
            return  # told twice
        if replica is None:
            self.unbook(request.request_id)
            return  # removed between the choice and now: nothing to remember
        if booking is None or booking.replica_id != replica_id:  # not booked, or booked elsewhere: count it here
            self.unbook(request.request_id)
            booking = self._book(request, replica, confirmed=True)
        else:
            booking.confirmed = True
            replica.drop_pending(booking.digests)
            replica.sent.update(booking.digests)
        key = decision.prefix_key if decision is not None else None
        if key is not None:
            self.traffic.track(key)
        # What the request costs where its prefix is cached (beyond the deepest match), not what this choice cost
        depth = _position(request.digests, key) + 1 if key is not None else 0
        self.traffic.add(request.digests, min(booking.added, self._work_of(request, depth)) if depth else booking.added)
        if decision is not None:
            self.num_routed[decision.reason] += 1

    def on_finished(self, request_id: Hashable) -> None:
        """Record that a routed request ended (any outcome); unknown ids are ignored, and one never accepted is
        unbooked."""
        if self.unbook(request_id):
            return
        booking = self._inflight.pop(request_id, None)
        if booking is None:
            return
        replica = self._replicas.get(booking.replica_id)
        if replica is not None:
            replica.finished_since_report += booking.added
            replica.refresh_load()

    def check_integrity(self) -> None:
        """Assert the bookkeeping: loads >= 0, the work total is the replicas' sum, in-flight requests name known
        replicas, the cached candidate list matches the known set."""
        replicas = self._replicas.values()
        assert all(r.load >= 0 for r in replicas), "a negative load estimate"
        total = sum(r.work for r in replicas)
        assert abs(total - self._total_work) <= 1e-6 * max(1.0, total), f"work total {self._total_work} != {total}"
        assert all(b.replica_id in self._replicas for b in self._inflight.values()), \
            "an in-flight request of a lost replica"
        for replica in replicas:  # pending blocks are exactly those of the replica's unconfirmed bookings
            expected: Counter = Counter()
            for b in self._inflight.values():
                if b.replica_id == replica.replica_id and not b.confirmed:
                    expected.update(b.digests)
            assert replica.pending == expected, f"{replica.replica_id}: pending blocks out of step with bookings"
        assert self._pool is None or self._pool == list(replicas), "stale candidate list"

    # -- helpers -----------------------------------------------------------------------------------------
    def _candidates(self, candidates: Iterable[Hashable] | None) -> list[ReplicaView]:
        if candidates is None:
            if self._pool is None:
                self._pool = list(self._replicas.values())
            pool = self._pool
        else:
            candidates = list(candidates)
            pool = [self._replicas[c] for c in dict.fromkeys(candidates) if c in self._replicas]
        if not pool:
            raise ValueError(
                f"no known replica to route to ({len(self._replicas)} known, candidates {candidates!r}): call "
                "add_replica() for each replica first"
            )
        return pool

    def _work_of(self, request: RouteRequest, cached_blocks: int) -> int:
        uncached = max(0, request.num_prompt_tokens - cached_blocks * self.config.block_size)
        return uncached + max(0, request.num_output_tokens)

    def _fitting(self, affine: list[tuple[ReplicaView, int]], pool: list[ReplicaView]
                 ) -> list[tuple[ReplicaView, int]]:
        """Affine replicas within both load bounds (see the module docstring)."""
        cfg = self.config
        mean_request = self.mean_request_tokens
        # The candidates' mean load, not the lightest's: the minimum of N loads falls as N grows, the mean does not
        queue_base = sum(r.load for r in pool) / len(pool) + mean_request
        mean_work = self._total_work / max(1, len(self._replicas))
        work_bound = cfg.balance_factor * mean_work + mean_request * self._unit
        return [(r, g) for r, g in affine
                if r.load <= queue_base + cfg.queue_factor * g and r.work <= work_bound]

    def _weight(self, replica: ReplicaView) -> float:
        return replica.work / self._unit + replica.load

    def _choices(self, pool: list[ReplicaView], gains: dict[ReplicaView, int] | None = None) -> list[ReplicaView]:
        """The `NUM_CHOICES` lightest of `pool`, lightest first: weight (recent work + load) less the prefill the
        replica's match saves, when it saves some."""
        # A random order first: exact ties go to a random replica (the sort below is stable)
        drawn = self._rng.sample(pool, len(pool))
        if not gains:
            return heapq.nsmallest(NUM_CHOICES, drawn, key=self._weight)
        return heapq.nsmallest(NUM_CHOICES, drawn, key=lambda r: self._weight(r) - gains.get(r, 0))

    def _rescale(self) -> None:
        for replica in self._replicas.values():
            replica.work /= self._unit
        self._total_work /= self._unit
        self._total_requests /= self._unit
        for booking in self._inflight.values():
            booking.credit /= self._unit
            booking.unit /= self._unit
        self._unit = 1.0

    def _decide(self, ranked: list[ReplicaView], reason: RouteReason, key: Hashable | None, wanted: int,
                digests: Sequence[Hashable]) -> RoutingDecision:
        unique = list(dict.fromkeys(ranked))
        return RoutingDecision(
            replica_ids=[r.replica_id for r in unique], reason=reason, num_cached_blocks=unique[0].match(digests),
            prefix_key=key, num_replicas_wanted=wanted,
        )


def _position(digests: Sequence[Hashable], key: Hashable) -> int:
    """Index of `key` in `digests` (chained: it occurs once), -1 when absent."""
    return next((i for i, d in enumerate(digests) if d == key), -1)
