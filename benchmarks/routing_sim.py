"""Routing simulator (issue 20, point 3): N replicas with LRU prefix caches behind five routing policies.

    python benchmarks/routing_sim.py                       # 8, 32 and 100 replicas, seed 0, ~1 minute
    python benchmarks/routing_sim.py --replicas 100 --seed 3 --out /tmp/r.md

Discrete events, one process, no torch. What is modelled:
- workload: sessions start as a Poisson stream. 55% are chats (2-12 turns; each turn's prompt is the system prompt
  plus the whole history plus a new user message; the user thinks ~3 s between turns), 35% are one-off questions
  under a system prompt, 10% are one-off prompts that share nothing. System prompts (800-3200 tokens) are drawn
  from 1,000 by Zipf(1.0): the top one carries ~13% of sessions, far more than one replica of 100 should take.
- tokens are only counted, never made: a block's key is a chained hash of (parent key, the segments it covers),
  exactly as `prefix_digests` chains real blocks; 16 tokens a block.
- a replica: one FIFO queue and a prefix cache of 8,192 blocks in LRU order (a parent is touched after its
  children, so leaves go first and the cache stays closed under prefixes, as the radix tree is). A request's
  service time is 0.1 ms per uncached prompt token + 1 ms per output token (a batched decode ~1k tokens/s); the
  prompt is looked up and cached when its service starts, the output blocks when it ends.
- load: arrivals are set so a cluster *without* prefix caching would be at `--load` (default 0.9) utilization.

Policies: round robin; power of two choices on queue length (Ray Serve's default); consistent hashing of the
first block (64 virtual nodes a replica); Ray Serve LLM's PrefixCacheAffinityRouter as its docs and source
describe it (a router-side tree of the prompts it sent to each replica, never evicted by default; when max-min
queue length <= 10: replicas with the longest match if it covers >= 10% of the prompt, else the replica with the
least text in the tree, the shortest queue among them; otherwise power of two); ours (`CacheAwareRouter`: replica
summaries every 1 s, 8,192 fingerprints max, plus what it sent since; load bound; hot-prefix spreading).
Metrics count requests that arrive after a warm-up (the first 10% of the session window). No router retries and
no per-replica concurrency cap (Ray's max_ongoing_requests) are modelled: queues are unbounded for every policy.
"""

from __future__ import annotations

import argparse
import bisect
import hashlib
import heapq
import itertools
import os
import platform
import random
import sys
import time
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from itertools import islice
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hf_paged.scaleout import CacheAwareRouter, RouteRequest, RouterConfig  # noqa: E402

BS = 16  # tokens per block
PREFILL_S = 1e-4  # replica seconds per uncached prompt token
DECODE_S = 1e-3  # replica seconds per output token
CACHE_BLOCKS = 8192  # per replica
OUTPUT_BUDGET = 512  # max_tokens of every request (what routers and load reports count)
REPORT_PERIOD = 1.0  # seconds between a replica's summaries
SUMMARY_CAP = 8192  # fingerprints per summary
NUM_SYSTEM_PROMPTS = 1000
ZIPF_S = 1.0
THINK_S = 3.0
REQUESTS_PER_REPLICA = 250
WARMUP = 0.1


# -- workload ------------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Stream:
    """A token stream as chained block keys: full blocks so far, plus the segments of the partial last block."""

    keys: list[int] = field(default_factory=list)
    tail: tuple = ()
    tail_len: int = 0

    def extend(self, segment: int, length: int) -> Stream:
        keys, tail, tail_len, offset = list(self.keys), self.tail, self.tail_len, 0
        while offset < length:
            take = min(BS - tail_len, length - offset)
            tail, tail_len, offset = tail + ((segment, offset, take),), tail_len + take, offset + take
            if tail_len == BS:
                keys.append(hash((keys[-1] if keys else 0, tail)))
                tail, tail_len = (), 0
        return Stream(keys, tail, tail_len)

    @property
    def num_tokens(self) -> int:
        return len(self.keys) * BS + self.tail_len


@dataclass(slots=True)
class Session:
    start: float
    system: int | None  # system prompt index, None for a prompt that shares nothing
    turns: list[tuple[int, int]]  # (user tokens, output tokens) per turn
    think: list[float]  # seconds before each follow-up turn


def make_workload(num_replicas: int, load: float, rng: random.Random) -> tuple[list[Session], list[int], float]:
    """Sessions, system prompt lengths, and the end of the session window."""
    system_lengths = [rng.randint(800, 3200) for _ in range(NUM_SYSTEM_PROMPTS)]
    weights = [1.0 / (k + 1) ** ZIPF_S for k in range(NUM_SYSTEM_PROMPTS)]
    cumulative = list(itertools.accumulate(weights))
    sessions, num_requests, work = [], 0, 0.0
    while num_requests < REQUESTS_PER_REPLICA * num_replicas:
        kind = rng.random()
        if kind < 0.10:
            system, turns = None, [(rng.randint(200, 2000), rng.randint(50, 400))]
        else:
            system = bisect.bisect_left(cumulative, rng.random() * cumulative[-1])
            num_turns = 1 if kind < 0.45 else min(12, 2 + int(rng.expovariate(1 / 3)))
            turns = [(rng.randint(30, 300), rng.randint(50, 400)) for _ in range(num_turns)]
        think = [rng.expovariate(1 / THINK_S) for _ in turns]
        history = system_lengths[system] if system is not None else 0
        for user, out in turns:  # work without any prefix cache: what --load is relative to
            history += user
            work += history * PREFILL_S + out * DECODE_S
            history += out
        sessions.append(Session(0.0, system, turns, think))
        num_requests += len(turns)
    window = work / (load * num_replicas)
    for session, start in zip(sessions, sorted(rng.uniform(0, window) for _ in sessions)):
        session.start = start
    return sessions, system_lengths, window


# -- replicas ------------------------------------------------------------------------------------------------
@dataclass(slots=True, eq=False)
class Request:
    rid: int
    session: int
    turn: int
    arrival: float
    stream: Stream  # the prompt
    output_tokens: int
    replica: int = -1
    start: float = 0.0
    hit_tokens: int = 0
    predicted_blocks: int = -1  # what ours believed the replica held (-1: other policies)
    decision: object = None
    route: RouteRequest | None = None
    cached_keys: list[int] = field(default_factory=list)  # prompt + output blocks, cached when it ends


class Replica:
    def __init__(self, reports: bool, capacity: int) -> None:
        self.cache: OrderedDict[int, None] = OrderedDict()
        self.capacity = capacity
        self.reports = reports  # keep `members` (only for a policy that reads summaries)
        self.members: set[int] = set()  # the cache's keys again: a set copies ~7x faster than an OrderedDict
        self.last_summary: frozenset[int] = frozenset()
        self.changed = False
        self.queue: deque[Request] = deque()
        self.current: Request | None = None
        self.done_at = 0.0
        self.busy = 0.0

    def lookup_and_cache(self, keys: list[int]) -> int:
        hit = self.cached_blocks(keys)
        self.touch(keys)
        return hit

    def touch(self, keys: list[int]) -> None:
        cache, fresh = self.cache, []
        for key in reversed(keys):  # parents last: most recent, evicted after their children
            if key in cache:
                cache.move_to_end(key)
            else:
                cache[key] = None
                fresh.append(key)
        if not fresh:
            return
        if self.reports:
            self.members.update(fresh)
            self.changed = True
        for _ in range(len(cache) - self.capacity):
            key, _ = cache.popitem(last=False)
            if self.reports:
                self.members.discard(key)

    def summary(self, cap: int) -> frozenset[int]:
        """The `cap` most recently used keys (prefix-closed, like `RadixCache.cached_digests`)."""
        if self.changed:
            self.changed = False
            if len(self.cache) <= cap:
                self.last_summary = frozenset(self.members)
            else:
                self.last_summary = frozenset(islice(reversed(self.cache), cap))
        return self.last_summary

    def cached_blocks(self, keys: list[int]) -> int:
        cache, hit = self.cache, 0
        for key in keys:
            if key not in cache:
                break
            hit += 1
        return hit

    def load_tokens(self, now: float) -> int:
        """Queued + running tokens as `engine_load_tokens` counts them (prompt not cached + output budget)."""
        load = sum(r.stream.num_tokens - self.cached_blocks(r.stream.keys) * BS + OUTPUT_BUDGET for r in self.queue)
        if self.current is not None:
            total = self.done_at - self.current.start
            left = (self.done_at - now) / total if total > 0 else 0.0
            load += int(left * (self.current.stream.num_tokens - self.current.hit_tokens + OUTPUT_BUDGET))
        return load

    @property
    def ongoing(self) -> int:
        return len(self.queue) + (self.current is not None)


# -- policies ------------------------------------------------------------------------------------------------
class RoundRobin:
    name = "round robin"

    def __init__(self, n: int, rng: random.Random) -> None:
        self.n, self.next = n, 0

    def choose(self, request: Request, replicas: list[Replica]) -> int:
        self.next = (self.next + 1) % self.n
        return self.next


class PowerOfTwo:
    name = "power of two"

    def __init__(self, n: int, rng: random.Random) -> None:
        self.n, self.rng = n, rng

    def choose(self, request: Request, replicas: list[Replica]) -> int:
        a, b = self.rng.sample(range(self.n), 2)
        return b if replicas[b].ongoing < replicas[a].ongoing else a


class ConsistentHash:
    name = "consistent hash (1st block)"

    def __init__(self, n: int, rng: random.Random, vnodes: int = 64) -> None:
        ring = sorted((int.from_bytes(hashlib.blake2b(f"{r}/{v}".encode(), digest_size=8).digest(), "little"), r)
                      for r in range(n) for v in range(vnodes))
        self.points, self.owners = [p for p, _ in ring], [r for _, r in ring]

    def choose(self, request: Request, replicas: list[Replica]) -> int:
        key = request.stream.keys[0] & 0xFFFFFFFFFFFFFFFF
        i = bisect.bisect(self.points, key) % len(self.points)
        return self.owners[i]


class RayPrefixAffinity:
    """Ray Serve LLM's PrefixCacheAffinityRouter policy, at block granularity (its tree is per character)."""

    name = "Ray PrefixCacheAffinity"

    def __init__(self, n: int, rng: random.Random, imbalanced_threshold: int = 10,
                 match_rate_threshold: float = 0.1) -> None:
        self.n, self.rng = n, rng
        self.tree: dict[int, set[int]] = {}  # block key -> replicas it was sent to (no eviction: Ray's default)
        self.size = [0] * n  # blocks each replica owns in the tree ("smallest tenant")
        self.imbalanced, self.min_rate = imbalanced_threshold, match_rate_threshold

    def choose(self, request: Request, replicas: list[Replica]) -> int:
        queues = [r.ongoing for r in replicas]
        chosen: list[int] = []
        if max(queues) - min(queues) <= self.imbalanced:
            matched, tenants = 0, None
            for key in request.stream.keys:
                holders = self.tree.get(key)
                if not holders:
                    break
                matched, tenants = matched + 1, holders
            if matched * BS / request.stream.num_tokens < self.min_rate or tenants is None:
                least = min(self.size)
                chosen = [r for r in range(self.n) if self.size[r] == least]
            else:
                chosen = sorted(tenants)
        if not chosen:  # imbalanced: power of two choices
            chosen = self.rng.sample(range(self.n), 2)
        return min(chosen, key=lambda r: queues[r])

    def routed(self, request: Request) -> None:
        for key in request.stream.keys:
            holders = self.tree.setdefault(key, set())
            if request.replica not in holders:
                holders.add(request.replica)
                self.size[request.replica] += 1


class Ours:
    name = "ours (CacheAwareRouter)"

    def __init__(self, n: int, rng: random.Random, config: RouterConfig | None = None) -> None:
        self.router = CacheAwareRouter(config or RouterConfig(block_size=BS), seed=rng.randrange(2**32))
        for r in range(n):
            self.router.add_replica(r)
        self.summary_bytes: list[int] = []
        self.route_s = 0.0

    def choose(self, request: Request, replicas: list[Replica]) -> int:
        t0 = time.perf_counter()
        request.route = RouteRequest(request.rid, request.stream.keys, request.stream.num_tokens, OUTPUT_BUDGET)
        decision = self.router.route(request.route)
        request.decision, request.predicted_blocks = decision, decision.num_cached_blocks
        self.route_s += time.perf_counter() - t0
        return decision.replica_ids[0]

    def routed(self, request: Request) -> None:
        t0 = time.perf_counter()
        self.router.on_routed(request.route, request.replica, request.decision)
        self.route_s += time.perf_counter() - t0

    def finished(self, request: Request) -> None:
        self.router.on_finished(request.rid)

    def report(self, index: int, keys: frozenset[int], load: int) -> None:
        self.summary_bytes.append(8 * len(keys) + 40)
        self.router.report(index, keys=keys, load_tokens=load)


POLICIES = [RoundRobin, PowerOfTwo, ConsistentHash, RayPrefixAffinity, Ours]


# -- the event loop ------------------------------------------------------------------------------------------
@dataclass(slots=True)
class Result:
    policy: str
    num_replicas: int
    num_requests: int
    hit_rate: float
    ideal_hit_rate: float
    max_over_mean: float
    utilization: float
    p50_queue_s: float
    p99_queue_s: float
    over_predicted: float  # ours: share of requests that found fewer cached blocks than the router believed
    under_predicted: float  # ours: ... more than it believed (the summary had not caught up)
    prediction_error: float  # ours: mean |believed - found| cached tokens per request
    summary_kib: float
    route_us: float
    sim_s: float


def simulate(policy_cls, num_replicas: int, seed: int, load: float, *, config: RouterConfig | None = None,
             report_period: float = REPORT_PERIOD, summary_cap: int = SUMMARY_CAP, cache_blocks: int = CACHE_BLOCKS,
             label: str | None = None) -> Result:
    """One run. `config`, `report_period` and `summary_cap` only concern `Ours`."""
    wall = time.perf_counter()
    rng = random.Random(seed)
    sessions, system_lengths, window = make_workload(num_replicas, load, rng)
    systems = [Stream().extend(-1 - p, n) for p, n in enumerate(system_lengths)]
    policy = (policy_cls(num_replicas, random.Random(seed + 1)) if config is None
              else policy_cls(num_replicas, random.Random(seed + 1), config))
    replicas = [Replica(hasattr(policy, "report"), cache_blocks) for _ in range(num_replicas)]
    segments = itertools.count(1)
    events: list = []
    order = itertools.count()
    for i, s in enumerate(sessions):
        heapq.heappush(events, (s.start, next(order), "arrive", i, 0))
    if hasattr(policy, "report") and report_period != float("inf"):
        for r in range(num_replicas):  # staggered: replicas do not report in step
            heapq.heappush(events, (report_period * (r + 1) / num_replicas, next(order), "report", r, 0))
    streams: dict[int, Stream] = {}
    finished: list[Request] = []
    rids = itertools.count()
    warm = WARMUP * window
    live_sessions = len(sessions)

    def start(replica: Replica, request: Request, now: float) -> None:
        request.start = now
        request.hit_tokens = replica.lookup_and_cache(request.stream.keys) * BS
        service = (request.stream.num_tokens - request.hit_tokens) * PREFILL_S + request.output_tokens * DECODE_S
        replica.current, replica.done_at = request, now + service
        replica.busy += service
        heapq.heappush(events, (now + service, next(order), "done", request.replica, 0))

    while events:
        now, _, kind, a, b = heapq.heappop(events)
        if kind == "report":
            if live_sessions:
                policy.report(a, replicas[a].summary(summary_cap), replicas[a].load_tokens(now))
                heapq.heappush(events, (now + report_period, next(order), "report", a, 0))
        elif kind == "arrive":
            session = sessions[a]
            base = streams.pop(a) if b else (systems[session.system] if session.system is not None else Stream())
            user, out = session.turns[b]
            request = Request(next(rids), a, b, now, base.extend(next(segments), user), out)
            request.replica = policy.choose(request, replicas)
            if hasattr(policy, "routed"):
                policy.routed(request)
            replica = replicas[request.replica]
            if replica.current is None:
                start(replica, request, now)
            else:
                replica.queue.append(request)
        else:  # done
            replica = replicas[a]
            request = replica.current
            assert request is not None
            full = request.stream.extend(next(segments), request.output_tokens)
            replica.touch(full.keys)
            request.cached_keys = full.keys
            finished.append(request)
            if hasattr(policy, "finished"):
                policy.finished(request)
            session = sessions[request.session]
            if request.turn + 1 < len(session.turns):
                streams[request.session] = full
                heapq.heappush(events, (now + session.think[request.turn], next(order), "arrive",
                                        request.session, request.turn + 1))
            else:
                live_sessions -= 1
            replica.current = None
            if replica.queue:
                start(replica, replica.queue.popleft(), now)

    measured = [r for r in finished if r.arrival >= warm]
    prompt_tokens = sum(r.stream.num_tokens for r in measured)
    ideal = _ideal_hits(finished, warm) if isinstance(policy, Ours) else 0
    waits = sorted(r.start - r.arrival for r in measured)
    busy = [rep.busy for rep in replicas]
    span = max(r.start for r in finished) if finished else 1.0
    ours = isinstance(policy, Ours)
    errors = [r.predicted_blocks * BS - r.hit_tokens for r in measured] if ours else [0]
    return Result(
        policy=label or policy.name, num_replicas=num_replicas, num_requests=len(measured),
        hit_rate=sum(r.hit_tokens for r in measured) / prompt_tokens, ideal_hit_rate=ideal / prompt_tokens,
        max_over_mean=max(busy) / (sum(busy) / len(busy)), utilization=sum(busy) / (span * num_replicas),
        p50_queue_s=waits[len(waits) // 2], p99_queue_s=waits[min(len(waits) - 1, int(0.99 * len(waits)))],
        over_predicted=sum(e > 0 for e in errors) / len(errors),
        under_predicted=sum(e < 0 for e in errors) / len(errors),
        prediction_error=sum(map(abs, errors)) / len(errors),
        summary_kib=(sum(policy.summary_bytes) / len(policy.summary_bytes) / 1024) if ours and policy.summary_bytes
        else 0.0,
        route_us=(policy.route_s / len(finished) * 1e6) if ours else 0.0,
        sim_s=time.perf_counter() - wall,
    )


def _ideal_hits(finished: list[Request], warm: float) -> int:
    """Hit tokens (of requests arriving after `warm`) of one infinite cache holding every earlier prompt and
    output, in arrival order: the ceiling any routing policy could reach on this workload."""
    seen: set[int] = set()
    hits = 0
    for request in sorted(finished, key=lambda r: r.arrival):
        keys = request.stream.keys
        n = 0
        while n < len(keys) and keys[n] in seen:
            n += 1
        hits += n * BS if request.arrival >= warm else 0
        seen.update(request.cached_keys)
    return hits


# -- report --------------------------------------------------------------------------------------------------
def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
    except OSError:
        pass
    return f"{cpu}, {os.cpu_count()} cores, python {platform.python_version()}"


def table(results: list[Result]) -> str:
    head = ("| replicas | policy | requests | prefix hit rate | max/mean load | utilization | p50 queue ms | "
            "p99 queue ms |")
    lines = [head, "|" + "---|" * 8]
    for r in results:
        lines.append(f"| {r.num_replicas} | {r.policy} | {r.num_requests} | {r.hit_rate:.1%} | {r.max_over_mean:.3f} | "
                     f"{r.utilization:.2f} | {r.p50_queue_s * 1e3:.1f} | {r.p99_queue_s * 1e3:.1f} |")
    return "\n".join(lines)


def verdict(results: list[Result]) -> list[str]:
    out = []
    for n in sorted({r.num_replicas for r in results}):
        by = {r.policy: r for r in results if r.num_replicas == n}
        ours, p2c = by.get(Ours.name), by.get(PowerOfTwo.name)
        if ours is None or p2c is None:
            continue
        limit = p2c.p99_queue_s * 1.10
        checks = {
            f"hit rate {ours.hit_rate:.1%} >= 90% (this workload's ceiling, one infinite cache that saw every "
            f"earlier request: {ours.ideal_hit_rate:.1%})": ours.hit_rate >= 0.90,
            f"max/mean load {ours.max_over_mean:.3f} <= 1.25": ours.max_over_mean <= 1.25,
            f"p99 queue {ours.p99_queue_s * 1e3:.0f} ms <= power of two's {p2c.p99_queue_s * 1e3:.0f} ms + 10% "
            f"({limit * 1e3:.0f} ms)": ours.p99_queue_s <= limit,
        }
        marks = "; ".join(f"{text}: {'yes' if ok else 'NO'}" for text, ok in checks.items())
        scope = "the target" if n == 100 else "the target is set for 100 replicas; for reference"
        out.append(
            f"- {n} replicas ({scope}): {marks}. Summaries {ours.summary_kib:.1f} KiB on average; the router "
            f"believed too much cached for {ours.over_predicted:.1%} of requests and too little for "
            f"{ours.under_predicted:.1%} (mean error {ours.prediction_error:.0f} tokens); routing cost "
            f"{ours.route_us:.0f} us a request (wall time, this machine)."
        )
    return out


# Variants of ours (and, with small caches, two baselines): what each mechanism, the summaries' freshness and size,
# and the replicas' own reports (against the router's record alone, when caches evict) are worth.
SMALL = 1024  # blocks a replica in the small-cache rows: evictions make what the router sent go stale
ABLATIONS = [
    ("ours (defaults: summaries every 1 s, <= 8192)", None, {}),
    ("summaries every 0.25 s", None, dict(report_period=0.25)),
    ("summaries every 5 s", None, dict(report_period=5.0)),
    ("summaries every 30 s", None, dict(report_period=30.0)),
    ("no summaries (router's own record only)", None, dict(report_period=float("inf"))),
    ("summaries capped at 1024 fingerprints", None, dict(summary_cap=1024)),
    ("no hot-prefix spreading", None, dict(config=RouterConfig(block_size=BS, hot_threshold=1e9))),
    ("no work bound (queued tokens only)", None, dict(config=RouterConfig(block_size=BS, balance_factor=1e9))),
    ("no work bound, no hot spreading", None, dict(config=RouterConfig(block_size=BS, balance_factor=1e9,
                                                                        hot_threshold=1e9))),
    (f"{SMALL}-block caches: ours", None, dict(cache_blocks=SMALL)),
    (f"{SMALL}-block caches: ours, no summaries", None, dict(cache_blocks=SMALL, report_period=float("inf"))),
    (f"{SMALL}-block caches: Ray PrefixCacheAffinity", "RayPrefixAffinity", dict(cache_blocks=SMALL)),
    (f"{SMALL}-block caches: power of two", "PowerOfTwo", dict(cache_blocks=SMALL)),
]


def ablation_table(results: list[Result]) -> str:
    lines = ["| variant | prefix hit rate | max/mean load | p99 queue ms | believed too much / too little | "
             "summary KiB |", "|---|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r.policy} | {r.hit_rate:.1%} | {r.max_over_mean:.3f} | {r.p99_queue_s * 1e3:.0f} | "
                     f"{r.over_predicted:.1%} / {r.under_predicted:.1%} | {r.summary_kib:.1f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--replicas", type=int, nargs="+", default=[8, 32, 100])
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--load", type=float, default=0.9,
                        help="utilization a cluster without prefix caching would see (sets the arrival rate)")
    parser.add_argument("--ablation", action="store_true",
                        help="instead: variants of ours at the largest --replicas (report period, cap, mechanisms)")
    parser.add_argument("--out", type=Path, default=None, help="also write the report (markdown) here")
    args = parser.parse_args(argv)
    wall = time.perf_counter()
    results = []
    if args.ablation:
        n = max(args.replicas)
        for label, cls, kwargs in ABLATIONS:
            results.append(simulate(globals()[cls] if cls else Ours, n, args.seed, args.load, label=label, **kwargs))
            print(f"  ran {n} replicas, {label}: {results[-1].sim_s:.1f} s", file=sys.stderr, flush=True)
        body = [f"{n} replicas, variants:", "", ablation_table(results)]
    else:
        for n in args.replicas:
            for cls in POLICIES:
                results.append(simulate(cls, n, args.seed, args.load))
                print(f"  ran {n} replicas, {cls.name}: {results[-1].sim_s:.1f} s", file=sys.stderr, flush=True)
        body = [table(results), "", *verdict(results)]
    text = "\n".join([
        f"machine: {machine()}",
        f"date: {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}",
        f"command: python benchmarks/routing_sim.py --replicas {' '.join(map(str, args.replicas))} "
        f"--seed {args.seed} --load {args.load}{' --ablation' if args.ablation else ''}",
        f"model: {BS}-token blocks, {CACHE_BLOCKS} blocks per replica (LRU), prefill {PREFILL_S * 1e3:g} ms/token, "
        f"decode {DECODE_S * 1e3:g} ms/token, max_tokens {OUTPUT_BUDGET}, summaries every {REPORT_PERIOD:g} s "
        f"(<= {SUMMARY_CAP} fingerprints), {REQUESTS_PER_REPLICA} requests per replica, first "
        f"{WARMUP:.0%} of the session window not measured",
        "",
        *body,
        "",
        f"simulated in {time.perf_counter() - wall:.1f} s",
    ])
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
