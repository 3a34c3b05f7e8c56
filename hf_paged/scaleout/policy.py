"""Cache-aware routing: a pure policy object (no Ray, no clock, no I/O); the Ray adapter is a few lines around it.

Inputs: each replica's reported cache summary and load, what this router sent since, and the request's chained
block fingerprints. Output: a ranked list of replicas. For one request:

    match(r)  = the request's leading blocks replica r holds (last report | sent there in the last 2 periods)
    best      = max match;  key = the request's block at depth `best` (its affinity key);  holders match `best`
    wanted    = replicas the key's share of recent work calls for (1 unless the prefix is hot)
    fits(r)   = load(r) <= lightest load + imbalance_tokens              (queueing: queued + running tokens)
                and work(r) <= balance_factor * mean work + slack        (long run: decayed work sent there)

    best == 0                                   -> power of two choices                         NO_MATCH
    holders < wanted and a power-of-two pick
      among the others is lighter than them     -> that replica (it joins the key)              HOT_ADMIT
    some holder fits                            -> the lighter of two fitting holders           AFFINITY / HOT_SPREAD
    otherwise                                   -> power of two choices                         IMBALANCED

"Lighter" compares work + load. The second test is consistent hashing with bounded loads (Mirrokni et al.):
queued + running tokens are near zero on every replica of a lightly loaded cluster, so the first test alone lets
sticky affinity pile 2x the mean work on the replicas that happened to catch popular prefixes (the simulator
measured it); bounding the decayed work a replica was sent keeps max/mean near `balance_factor`, and a prefix
that overflows its holders gains another (IMBALANCED), which spreads hot prefixes even before `wanted` does.

Load is in tokens (prompt still to compute + output budget): the replica's last report, plus what this router sent
since (its uncached part), minus what finished since. A reported summary is closed under prefixes (a radix tree's)
and so is what the router sent, so a replica's match is found by binary search.
"""

from __future__ import annotations

import enum
import random
from collections import Counter
from collections.abc import Collection, Hashable, Iterable, Sequence
from dataclasses import dataclass, field

from hf_paged.scaleout.traffic import PrefixTraffic

__all__ = ["CacheAwareRouter", "RouteReason", "RouteRequest", "RouterConfig", "RoutingDecision"]


@dataclass(slots=True)
class RouterConfig:
    """Knobs of `CacheAwareRouter`; the defaults are the ones `benchmarks/routing_sim.py` measured."""

    block_size: int = 16  # tokens per block, as on the replicas (load estimates count cached blocks in tokens)
    imbalance_tokens: int = 8192  # affinity holds while a holder's load <= the lightest's + this
    balance_factor: float = 1.2  # ... and while its recent work <= this x the mean (+ balance_slack_tokens)
    balance_slack_tokens: int = 1024
    balance_half_life: float = 50.0  # routed requests per replica after which work counts half
    hot_threshold: float = 1.0  # a prefix past this many replicas' fair share of work gets share*N/this replicas
    traffic_half_life: float = 2000.0  # routed requests after which a request weighs half in the prefix shares

    def __post_init__(self) -> None:
        for name, low in (("block_size", 1), ("imbalance_tokens", 0), ("balance_slack_tokens", 0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"RouterConfig.{name} must be an int >= {low}, got {value!r}")
        if not self.balance_factor >= 1.0:
            raise ValueError(f"RouterConfig.balance_factor must be >= 1 (x the mean work), got {self.balance_factor!r}")
        for name in ("balance_half_life", "hot_threshold", "traffic_half_life"):
            if not getattr(self, name) > 0:
                raise ValueError(f"RouterConfig.{name} must be > 0, got {getattr(self, name)!r}")


class RouteReason(enum.Enum):
    NO_MATCH = "no_match"  # no replica holds the first block: power of two choices
    AFFINITY = "affinity"  # the lightest replica holding the longest prefix
    HOT_SPREAD = "hot_spread"  # a hot prefix: the lightest of the replicas holding it
    HOT_ADMIT = "hot_admit"  # a hot prefix with too few replicas: one more admitted (the lighter of two others)
    IMBALANCED = "imbalanced"  # every holder is past the load bound: power of two choices


@dataclass(frozen=True, slots=True)
class RouteRequest:
    """What the router needs to know about a request."""

    request_id: Hashable  # unique while in flight (the adapter's id)
    digests: Sequence[Hashable]  # fingerprints of the prompt's full blocks, chained (`prompt_fingerprints`)
    num_prompt_tokens: int  # prompt length
    num_output_tokens: int = 0  # output budget (max new tokens): the decode part of the load it adds


@dataclass(frozen=True, slots=True)
class RoutingDecision:
    """A ranked choice: try `replica_ids[0]`, fall back in order."""

    replica_ids: list[Hashable]  # best first, no duplicates, all known candidates
    reason: RouteReason
    num_cached_blocks: int  # blocks the first choice is believed to hold (reported | sent since)
    prefix_key: Hashable | None  # the affinity key (deepest block any replica holds); None when nothing matched
    num_replicas_wanted: int  # replicas the key's load calls for (1 unless hot)


@dataclass(slots=True, eq=False)
class _Replica:
    replica_id: Hashable
    keys: frozenset = frozenset()  # fingerprints of the last report
    sent: set = field(default_factory=set)  # fingerprints routed here since the last report
    sent_before: set = field(default_factory=set)  # ... in the period before: may still be queued at the report
    reported_load: int = 0
    sent_since_report: int = 0
    finished_since_report: int = 0
    load: int = 0  # max(0, reported_load + sent_since_report - finished_since_report)
    work: float = 0.0  # decayed work routed here, in the router's inflated units (see CacheAwareRouter._unit)
    num_reports: int = 0

    def holds(self, key: Hashable) -> bool:
        return key in self.keys or key in self.sent or key in self.sent_before

    def match(self, digests: Sequence[Hashable]) -> int:
        """Leading digests held. Holdings are closed under prefixes, so this is a binary search."""
        if not digests or not self.holds(digests[0]):
            return 0
        keys, sent, before = self.keys, self.sent, self.sent_before
        low, high = 1, len(digests)  # digests[:low] held; digests[high:] may or may not be
        while low < high:
            mid = (low + high + 1) // 2
            key = digests[mid - 1]
            if key in keys or key in sent or key in before:
                low = mid
            else:
                high = mid - 1
        return low

    def refresh_load(self) -> None:
        self.load = max(0, self.reported_load + self.sent_since_report - self.finished_since_report)


_RESCALE_AT = 1e100


class CacheAwareRouter:
    """Routes a request to a replica holding its longest prefix, within load bounds; spreads hot prefixes.

    Args:
        config: thresholds (see `RouterConfig`).
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
        self._replicas: dict[Hashable, _Replica] = {}
        self._pool: list[_Replica] | None = None  # list(self._replicas.values()), rebuilt after membership changes
        self._inflight: dict[Hashable, tuple[Hashable, int]] = {}  # request id -> (replica id, load it added)
        # Decayed work without touching every replica per request: each request's credit is inflated by the
        # growth factor over the previous one; comparisons are ratios, and everything is rescaled before overflow.
        self._unit = 1.0
        self._total_work = 0.0
        self.traffic = PrefixTraffic(self.config.traffic_half_life)
        self.num_routed: Counter[RouteReason] = Counter()

    # -- membership and reports --------------------------------------------------------------------------
    @property
    def replica_ids(self) -> list[Hashable]:
        return list(self._replicas)

    def add_replica(self, replica_id: Hashable) -> None:
        """Make a replica routable (no-op if known). It starts with no summary, no load and no work."""
        if replica_id not in self._replicas:
            self._replicas[replica_id] = _Replica(replica_id)
            self._pool = None

    def remove_replica(self, replica_id: Hashable) -> None:
        """Forget a replica at once: its summary, what was sent to it, its work and in-flight requests."""
        replica = self._replicas.pop(replica_id, None)
        if replica is not None:
            self._pool = None
            self._total_work = max(0.0, self._total_work - replica.work)
            self._inflight = {rid: v for rid, v in self._inflight.items() if v[0] != replica_id}

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
        replica.keys = keys if isinstance(keys, frozenset) else frozenset(keys)
        replica.sent_before, replica.sent = replica.sent, set()  # what was sent two periods ago is in the report
        replica.reported_load, replica.sent_since_report, replica.finished_since_report = int(load_tokens), 0, 0
        replica.num_reports += 1
        replica.refresh_load()
        return True

    def load_of(self, replica_id: Hashable) -> int:
        """The router's estimate of a replica's queued + running tokens."""
        return self._replicas[replica_id].load

    def work_share(self, replica_id: Hashable) -> float:
        """The replica's share of the recent (decayed) work routed by this router; 0 before any routing."""
        return self._replicas[replica_id].work / self._total_work if self._total_work > 0 else 0.0

    def replica_stats(self, replica_id: Hashable) -> dict[str, float]:
        """The router's view of one replica (for debugging and metrics)."""
        replica = self._replicas[replica_id]
        return {"load_tokens": replica.load, "work_share": round(self.work_share(replica_id), 4),
                "num_reports": replica.num_reports, "num_fingerprints": len(replica.keys)}

    # -- routing -----------------------------------------------------------------------------------------
    def route(self, request: RouteRequest, candidates: Iterable[Hashable] | None = None) -> RoutingDecision:
        """Rank the known `candidates` (default: every known replica) for `request`. Changes no state but the
        random draws; call `on_routed` with the replica that took the request."""
        pool = self._candidates(candidates)
        digests = request.digests
        first = digests[0] if digests else None
        matches = [r.match(digests) if first in r.keys or first in r.sent or first in r.sent_before else 0
                   for r in pool]
        best = max(matches)
        if best == 0:
            return self._decide(self._two_choices(pool), RouteReason.NO_MATCH, None, 1, digests)
        key = digests[best - 1]
        wanted = self.traffic.replicas_wanted(key, len(self._replicas), self.config.hot_threshold)
        holders = [r for r, m in zip(pool, matches) if m == best]
        fitting = self._fitting(holders, pool)
        if len(holders) < wanted:
            others = [r for r, m in zip(pool, matches) if m < best]
            if others:
                newcomer = self._two_choices(others)[0]
                if not fitting or self._weight(newcomer) < min(self._weight(r) for r in fitting):
                    return self._decide([newcomer, *fitting], RouteReason.HOT_ADMIT, key, wanted, digests)
        if fitting:
            reason = RouteReason.HOT_SPREAD if wanted > 1 else RouteReason.AFFINITY
            return self._decide([*self._two_choices(fitting), *self._two_choices(pool)], reason, key, wanted, digests)
        return self._decide(self._two_choices(pool), RouteReason.IMBALANCED, key, wanted, digests)

    def on_routed(self, request: RouteRequest, replica_id: Hashable, decision: RoutingDecision | None = None) -> None:
        """Record that `replica_id` took `request`: its prefix counts as cached there from now, its work as added."""
        replica = self._replicas.get(replica_id)
        if replica is None:
            return  # removed between the choice and now: nothing to remember
        added = self._work_of(request, replica.match(request.digests))
        replica.sent.update(request.digests)
        replica.sent_since_report += added
        replica.refresh_load()
        self._inflight[request.request_id] = (replica_id, added)
        self._unit *= 2.0 ** (1.0 / (self.config.balance_half_life * max(1, len(self._replicas))))
        replica.work += added * self._unit
        self._total_work += added * self._unit
        if self._unit > _RESCALE_AT:
            self._rescale()
        if decision is not None and decision.prefix_key is not None:
            self.traffic.track(decision.prefix_key)
        self.traffic.add(request.digests, added)
        if decision is not None:
            self.num_routed[decision.reason] += 1

    def on_finished(self, request_id: Hashable) -> None:
        """Record that a routed request ended (any outcome); unknown ids are ignored."""
        entry = self._inflight.pop(request_id, None)
        if entry is None:
            return
        replica = self._replicas.get(entry[0])
        if replica is not None:
            replica.finished_since_report += entry[1]
            replica.refresh_load()

    def check_integrity(self) -> None:
        """Assert the bookkeeping: loads >= 0, the work total is the replicas' sum, in-flight requests name known
        replicas, the cached candidate list matches the known set."""
        replicas = self._replicas.values()
        assert all(r.load >= 0 for r in replicas), "a negative load estimate"
        total = sum(r.work for r in replicas)
        assert abs(total - self._total_work) <= 1e-6 * max(1.0, total), f"work total {self._total_work} != {total}"
        assert all(v[0] in self._replicas for v in self._inflight.values()), "an in-flight request of a lost replica"
        assert self._pool is None or self._pool == list(replicas), "stale candidate list"

    # -- helpers -----------------------------------------------------------------------------------------
    def _candidates(self, candidates: Iterable[Hashable] | None) -> list[_Replica]:
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

    def _fitting(self, holders: list[_Replica], pool: list[_Replica]) -> list[_Replica]:
        """Holders within both load bounds (see the module docstring)."""
        cfg = self.config
        load_bound = min(r.load for r in pool) + cfg.imbalance_tokens
        mean = self._total_work / max(1, len(self._replicas))
        work_bound = cfg.balance_factor * mean + cfg.balance_slack_tokens * self._unit
        return [r for r in holders if r.load <= load_bound and r.work <= work_bound]

    def _weight(self, replica: _Replica) -> float:
        return replica.work / self._unit + replica.load

    def _two_choices(self, pool: list[_Replica]) -> list[_Replica]:
        """Two distinct replicas drawn at random, the lighter first (one if the pool has one)."""
        if len(pool) == 1:
            return [pool[0]]
        i, j = int(self._rng.random() * len(pool)), int(self._rng.random() * (len(pool) - 1))
        first, second = pool[i], pool[j + (j >= i)]
        return [second, first] if self._weight(second) < self._weight(first) else [first, second]

    def _rescale(self) -> None:
        for replica in self._replicas.values():
            replica.work /= self._unit
        self._total_work /= self._unit
        self._unit = 1.0

    def _decide(self, ranked: list[_Replica], reason: RouteReason, key: Hashable | None, wanted: int,
                digests: Sequence[Hashable]) -> RoutingDecision:
        unique = list(dict.fromkeys(ranked))
        return RoutingDecision(
            replica_ids=[r.replica_id for r in unique], reason=reason, num_cached_blocks=unique[0].match(digests),
            prefix_key=key, num_replicas_wanted=wanted,
        )
