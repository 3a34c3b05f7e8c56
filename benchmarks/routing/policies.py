"""Routing policies of the simulator. Each has `choose(request, replicas) -> replica index` and may have
`routed(request)`, `finished(request)`, `report(index, keys, load)` and `events(index, kinds, keys)` (ours alone
reads reports and block events).

Baselines: round robin; power of two choices on queue length (Ray Serve's default); consistent hashing of the first
block (64 virtual nodes a replica); consistent hashing with bounded loads (Mirrokni et al., c = 1.25) on the first 4
blocks; Ray Serve LLM's PrefixCacheAffinityRouter as its docs and source describe it. Reference: an oracle that
sees the replicas' true caches and takes the longest match among replicas within the same load bound as the
bounded hash. Ours: `CacheAwareRouter` with its defaults, fed summaries every period plus what it sent.
"""

from __future__ import annotations

import bisect
import hashlib
import math
import random
import time

from benchmarks.routing.replica import Replica, SimRequest
from hf_paged.scaleout import CacheAwareRouter, RouterConfig, RouteRequest

__all__ = ["BASELINES", "BoundedHash", "ConsistentHash", "Oracle", "Ours", "PowerOfTwo", "RayPrefixAffinity",
           "RoundRobin"]


class RoundRobin:
    name = "round robin"

    def __init__(self, n: int, rng: random.Random, block_size: int) -> None:
        self.n, self.next = n, 0

    def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
        self.next = (self.next + 1) % self.n
        return self.next


class PowerOfTwo:
    name = "power of two"

    def __init__(self, n: int, rng: random.Random, block_size: int) -> None:
        self.n, self.rng = n, rng

    def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
        a, b = self.rng.sample(range(self.n), 2)
        return b if replicas[b].ongoing < replicas[a].ongoing else a


def _ring(n: int, vnodes: int = 64) -> tuple[list[int], list[int]]:
    ring = sorted((int.from_bytes(hashlib.blake2b(f"{r}/{v}".encode(), digest_size=8).digest(), "little"), r)
                  for r in range(n) for v in range(vnodes))
    return [p for p, _ in ring], [r for _, r in ring]


class ConsistentHash:
    name = "consistent hash (1st block)"
    depth = 1

    def __init__(self, n: int, rng: random.Random, block_size: int) -> None:
        self.n, self.rng = n, rng
        self.points, self.owners = _ring(n)

    def point(self, request: SimRequest) -> int:
        if not request.keys:
            return self.rng.getrandbits(64)
        return request.keys[min(self.depth, len(request.keys)) - 1] & 0xFFFFFFFFFFFFFFFF

    def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
        return self.owners[bisect.bisect(self.points, self.point(request)) % len(self.points)]


class BoundedHash(ConsistentHash):
    """Consistent hashing with bounded loads: walk the ring from the key's point to the first replica with fewer
    than ceil(c * (in flight + 1) / n) requests in flight."""

    name = "bounded consistent hash (c=1.25, 4 blocks)"
    depth = 4

    def __init__(self, n: int, rng: random.Random, block_size: int, c: float = 1.25) -> None:
        super().__init__(n, rng, block_size)
        self.c, self.inflight, self.total = c, [0] * n, 0

    def capacity(self) -> int:
        return math.ceil(self.c * (self.total + 1) / self.n)

    def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
        cap, i = self.capacity(), bisect.bisect(self.points, self.point(request))
        for step in range(len(self.points)):
            owner = self.owners[(i + step) % len(self.points)]
            if self.inflight[owner] < cap:
                return owner
        raise AssertionError("bounded loads always leave a replica under the cap")

    def routed(self, request: SimRequest) -> None:
        self.inflight[request.replica] += 1
        self.total += 1

    def finished(self, request: SimRequest) -> None:
        self.inflight[request.replica] -= 1
        self.total -= 1


class Oracle(BoundedHash):
    """The longest true cached prefix among replicas under the bounded-load cap; the fewest in flight on ties."""

    name = "oracle (true caches, same bound)"

    def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
        cap = self.capacity()
        under = [i for i in range(self.n) if self.inflight[i] < cap]
        self.rng.shuffle(under)
        return max(under, key=lambda i: (replicas[i].cached_blocks(request.keys), -self.inflight[i]))


class RayPrefixAffinity:
    """Ray Serve LLM's PrefixCacheAffinityRouter policy, at block granularity (its tree is per character): while
    max-min queue length <= 10, the replicas with the longest match of what it sent if it covers >= 10% of the
    prompt, else the one with the least text in its tree (the shortest queue among them); else power of two."""

    name = "Ray PrefixCacheAffinity"

    def __init__(self, n: int, rng: random.Random, block_size: int, imbalanced_threshold: int = 10,
                 match_rate_threshold: float = 0.1) -> None:
        self.n, self.rng, self.block_size = n, rng, block_size
        self.tree: dict[int, set[int]] = {}  # block key -> replicas it was sent to (no eviction: Ray's default)
        self.size = [0] * n  # blocks each replica owns in the tree ("smallest tenant")
        self.imbalanced, self.min_rate = imbalanced_threshold, match_rate_threshold

    def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
        queues = [r.ongoing for r in replicas]
        chosen: list[int] = []
        if max(queues) - min(queues) <= self.imbalanced:
            matched, tenants = 0, None
            for key in request.keys:
                holders = self.tree.get(key)
                if not holders:
                    break
                matched, tenants = matched + 1, holders
            if matched * self.block_size / request.num_prompt_tokens < self.min_rate or tenants is None:
                least = min(self.size)
                chosen = [r for r in range(self.n) if self.size[r] == least]
            else:
                chosen = sorted(tenants)
        if not chosen:
            chosen = self.rng.sample(range(self.n), 2)
        return min(chosen, key=lambda r: queues[r])

    def routed(self, request: SimRequest) -> None:
        for key in request.keys:
            holders = self.tree.setdefault(key, set())
            if request.replica not in holders:
                holders.add(request.replica)
                self.size[request.replica] += 1


class Ours:
    name = "ours (CacheAwareRouter)"

    def __init__(self, n: int, rng: random.Random, block_size: int, config: RouterConfig | None = None) -> None:
        self.router = CacheAwareRouter(config or RouterConfig(block_size=block_size), seed=rng.randrange(2**32))
        for r in range(n):
            self.router.add_replica(r)
        self.report_bytes = self.num_reports = 0  # summaries: 8 bytes a block + 40 (`CacheSummary.nbytes`)
        self.event_bytes = self.num_event_batches = 0  # block events: 9 bytes an event + 16 (`CacheEvents.nbytes`)
        self.route_s = 0.0

    def choose(self, request: SimRequest, replicas: list[Replica]) -> int:
        t0 = time.perf_counter()
        route = RouteRequest(request.rid, request.keys, request.num_prompt_tokens, request.max_tokens)
        decision = self.router.route(route)
        request.route, request.predicted_blocks = (route, decision), decision.num_cached_blocks
        self.route_s += time.perf_counter() - t0
        return decision.replica_ids[0]

    def routed(self, request: SimRequest) -> None:
        t0 = time.perf_counter()
        self.router.on_routed(request.route[0], request.replica, request.route[1])
        self.route_s += time.perf_counter() - t0

    def finished(self, request: SimRequest) -> None:
        self.router.on_finished(request.rid)

    def report(self, index: int, keys: frozenset[int], load: int) -> None:
        self.report_bytes += 8 * len(keys) + 48
        self.num_reports += 1
        self.router.report(index, keys=keys, load_tokens=load)

    def events(self, index: int, kinds: bytes, keys: list[int]) -> None:
        self.event_bytes += 9 * len(kinds) + 16
        self.num_event_batches += 1
        self.router.apply_events(index, kinds, keys)


BASELINES = [RoundRobin, PowerOfTwo, ConsistentHash, BoundedHash, RayPrefixAffinity]
