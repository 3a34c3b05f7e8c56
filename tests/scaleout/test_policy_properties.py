"""Property tests of CacheAwareRouter: random membership changes, reports, routes and completions."""

from __future__ import annotations

import math

from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from hf_paged.scaleout import CacheAwareRouter, RouterConfig, RouteReason, RouteRequest

BS = 4
REPLICAS = st.integers(0, 7)
PATHS = st.lists(st.integers(0, 3), min_size=0, max_size=6)  # a prompt: its blocks' symbols (a small prefix tree)


def chain(path: list[int]) -> list[int]:
    """Chained digests of a path: block i's key depends on every symbol up to it (as real digests do)."""
    return [hash((-1, *path[: i + 1])) for i in range(len(path))]  # ints: the same in every process


def closed(paths: list[list[int]]) -> set[int]:
    """What a radix tree holding these prompts reports: every prefix of each."""
    return {key for path in paths for key in chain(path)}


class RouterMachine(RuleBasedStateMachine):
    @initialize(queue=st.floats(0.0, 8.0), factor=st.floats(1.0, 3.0), hot=st.floats(0.2, 4.0),
                min_gain=st.floats(0.0, 0.5), shared=st.floats(0.5, 1.0), seed=st.integers(0, 3))
    def start(self, queue, factor, hot, min_gain, shared, seed):
        self.config = RouterConfig(block_size=BS, queue_factor=queue, balance_factor=factor, hot_threshold=hot,
                                   min_gain_share=min_gain, shared_share=shared)
        self.router = CacheAwareRouter(self.config, seed=seed)
        self.known: set[int] = set()
        self.inflight: list[int] = []
        self.next_id = 0

    @rule(replica=REPLICAS)
    def add(self, replica):
        self.router.add_replica(replica)
        self.known.add(replica)

    @rule(replica=REPLICAS)
    def remove(self, replica):
        self.router.remove_replica(replica)
        self.known.discard(replica)

    @rule(replica=REPLICAS, paths=st.lists(PATHS, max_size=4), load=st.integers(0, 20_000))
    def report(self, replica, paths, load):
        assert self.router.report(replica, keys=closed(paths), load_tokens=load) == (replica in self.known)
        assert set(self.router.replica_ids) == self.known  # a report never adds a replica

    @rule(path=PATHS, output=st.integers(0, 64), candidates=st.none() | st.lists(REPLICAS, max_size=5),
          pick=st.integers(0, 3))
    def route(self, path, output, candidates, pick):
        req = RouteRequest(self.next_id, chain(path), num_prompt_tokens=len(path) * BS + 1, num_output_tokens=output)
        self.next_id += 1
        pool = self.known if candidates is None else self.known & set(candidates)
        if not pool:
            try:
                self.router.route(req, candidates)
            except ValueError:
                return
            raise AssertionError("routing with no known candidate must raise")
        decision = self.router.route(req, candidates)
        ids = decision.replica_ids
        assert ids and len(ids) == len(set(ids)) and set(ids) <= pool, "only known candidates, each once"
        states = {r: self.router._replicas[r] for r in pool}
        matches = {r: s.match(req.digests) for r, s in states.items()}
        best = max(matches.values())
        cfg, prompt = self.config, max(1, req.num_prompt_tokens)
        k = max(1, math.ceil(cfg.shared_share * len(pool) - 1e-9))
        shared = min(sorted(matches.values(), reverse=True)[k - 1] * BS, prompt)
        gains = {r: min(m * BS, prompt) - shared for r, m in matches.items()}
        assert decision.num_cached_blocks == matches[ids[0]]
        if decision.reason is RouteReason.NO_MATCH:
            assert best == 0 and decision.prefix_key is None
        elif decision.reason is RouteReason.LOW_GAIN:
            assert decision.prefix_key is None, "a shared or small match is never a key"
            assert max(gains.values()) < max(1e-9, cfg.min_gain_share * prompt)
        else:
            assert best > 0 and decision.prefix_key == req.digests[best - 1]
        if decision.reason in (RouteReason.AFFINITY, RouteReason.HOT_SPREAD):
            gain = gains[ids[0]]
            assert gain > 0 and gain >= cfg.min_gain_share * prompt, "affinity saves more than the shared part"
            base = sum(s.load for s in states.values()) / len(states) + self.router.mean_request_tokens
            assert states[ids[0]].load <= base + cfg.queue_factor * gain + 1e-6, "queue bound respected"
        if decision.reason is RouteReason.HOT_ADMIT:
            assert matches[ids[0]] < best and decision.num_replicas_wanted > 1
        chosen = ids[min(pick, len(ids) - 1)]  # Ray may fall back to a later rank
        self.router.on_routed(req, chosen, decision)
        self.inflight.append(req.request_id)

    @rule(index=st.integers(0, 50))
    def finish(self, index):
        if self.inflight:
            self.router.on_finished(self.inflight.pop(index % len(self.inflight)))

    @invariant()
    def loads_are_sane(self):
        if hasattr(self, "router"):
            self.router.check_integrity()
            assert set(self.router.replica_ids) == self.known
            assert all(self.router.load_of(r) >= 0 for r in self.known)
            shares = [self.router.work_share(r) for r in self.known]
            assert all(0 <= s <= 1 + 1e-9 for s in shares) and sum(shares) <= 1 + 1e-6


TestRouterMachine = RouterMachine.TestCase
TestRouterMachine.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)


@settings(max_examples=100, deadline=None)
@given(num_replicas=st.integers(2, 12), holder=st.integers(0, 11), path=st.lists(st.integers(0, 3), min_size=1,
       max_size=8), held=st.integers(1, 8), load=st.integers(0, 10**6), seed=st.integers(0, 2**16))
def test_affinity_wins_when_balanced(num_replicas, holder, path, held, load, seed):
    router = CacheAwareRouter(RouterConfig(block_size=BS), seed=seed)
    holder %= num_replicas
    for r in range(num_replicas):
        router.add_replica(r)
        router.report(r, keys=closed([path[:held]]) if r == holder else set(), load_tokens=load)
    decision = router.route(RouteRequest("q", chain(path), num_prompt_tokens=len(path) * BS))
    matched = min(held, len(path))
    assert decision.num_cached_blocks == (matched if decision.replica_ids[0] == holder else 0)
    if matched >= RouterConfig().min_gain_share * len(path):
        assert decision.replica_ids[0] == holder and decision.reason is RouteReason.AFFINITY
    else:  # too small a share of the prompt to be worth a replica
        assert decision.reason is RouteReason.LOW_GAIN and decision.prefix_key is None


OPS = st.lists(st.tuples(st.sampled_from(["route", "report", "finish", "remove", "add"]), REPLICAS, PATHS,
                         st.integers(0, 5000)), max_size=60)


@settings(max_examples=50, deadline=None)
@given(ops=OPS, seed=st.integers(0, 2**16))
def test_same_seed_same_decisions(ops, seed):
    def run():
        router, out, rid = CacheAwareRouter(RouterConfig(block_size=BS), seed=seed), [], 0
        for r in range(4):
            router.add_replica(r)
        for op, replica, path, number in ops:
            if op == "route" and router.replica_ids:
                req = RouteRequest(rid, chain(path), num_prompt_tokens=len(path) * BS, num_output_tokens=number % 64)
                decision = router.route(req)
                router.on_routed(req, decision.replica_ids[0], decision)
                out.append((decision.replica_ids, decision.reason))
                rid += 1
            elif op == "report":
                router.report(replica, keys=closed([path]), load_tokens=number)
            elif op == "finish":
                router.on_finished(number % max(1, rid))
            elif op == "remove":
                router.remove_replica(replica)
            else:
                router.add_replica(replica)
        return out

    assert run() == run()
