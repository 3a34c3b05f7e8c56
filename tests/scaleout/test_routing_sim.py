"""The routing simulator: continuous-batching replicas step as specified, baselines keep their bounds, a trace in
the Mooncake format replays, runs are deterministic with a seed and rank policies as the full run does; the
per-request analysis (`benchmarks/routing/choices.py`) charges hit differences and bounds max/mean work exactly."""

from __future__ import annotations

import dataclasses
import json
import math
import random

import pytest

from benchmarks import routing_sim as sim
from benchmarks.routing import replica as rep
from benchmarks.routing.choices import Choice, attribute, lpt_max, run_recorded, work_bounds
from benchmarks.routing.policies import BoundedHash, Ours
from benchmarks.routing.workloads import Stream, chain, read_trace, write_synthetic_trace


@pytest.fixture(autouse=True)
def small(monkeypatch):
    monkeypatch.setattr(sim, "REQUESTS_PER_REPLICA", 60)
    monkeypatch.setattr(sim, "MIN_REQUESTS", 240)


def request(rid, prompt, output, keys=()):
    return rep.SimRequest(rid, rid, 0, 0.0, list(keys), prompt, output)


def test_a_step_shares_its_token_budget_between_decodes_and_prefill_chunks():
    replica = rep.Replica(capacity_blocks=1000, block_size=16)
    short, long = request(0, 100, 3), request(1, 20_000, 2)
    replica.waiting.extend([short, long])
    # Load as a replica reports it: the output budget (max_tokens), never the true output length
    assert replica.load_tokens(0.0) == 100 + rep.MAX_TOKENS + 20_000 + rep.MAX_TOKENS
    step = replica.plan(0.0)  # both admitted; the short prompt whole, the long one fills the budget
    assert [(r.rid, take) for r, take in step.chunks] == [(0, 100), (1, rep.MAX_BATCH_TOKENS - 100)]
    assert step.duration == pytest.approx(rep.STEP_S + rep.STEP_TOKEN_S * rep.MAX_BATCH_TOKENS)
    first, ended = replica.finish_step()
    assert first == [short] and short.first_token == pytest.approx(step.end) and not ended
    step = replica.plan(step.end)  # a decode token for the short one, the rest of the budget for the long one
    assert step.decodes == [short] and step.chunks == [(long, rep.MAX_BATCH_TOKENS - 1)]
    assert replica.load_tokens(step.start) == (rep.MAX_TOKENS - 1) + (20_000 - 8092 + rep.MAX_TOKENS)
    replica.finish_step()
    step = replica.plan(step.end)
    assert step.chunks == [(long, 20_000 - 2 * rep.MAX_BATCH_TOKENS + 101)]
    _, ended = replica.finish_step()
    assert ended == [short] and long.first_token == pytest.approx(step.end)
    step = replica.plan(step.end)  # only one decode left, nobody waiting: its last tokens as one event
    assert (step.count, step.decodes) == (long.output_left, [long])
    assert replica.work_tokens == 20_100 + 2


def test_a_multi_step_decode_is_cut_when_a_request_arrives():
    replica = rep.Replica(capacity_blocks=1000, block_size=16)
    r = request(0, 16, 50)
    r.prompt_left, r.output_left = 0, 50
    replica.running.append(r)
    step = replica.plan(0.0)
    assert step.count == 50
    replica.waiting.append(request(1, 16, 1))
    cut = replica.cut(step.duration * 2.5)  # the third step is in progress: it ends, then the newcomer joins
    assert cut is step and step.count == 3
    replica.finish_step()
    assert r.output_left == 47 and replica.plan(step.end).chunks[0][0].rid == 1


def test_the_prefix_cache_is_lru_and_closed_under_prefixes():
    replica = rep.Replica(capacity_blocks=4, block_size=16)
    replica.touch([1, 2, 3])
    replica.touch([9, 8])
    assert replica.cached_blocks([1, 2, 3]) == 2 and replica.cached_blocks([9, 8]) == 2  # the leaf 3 went first
    assert replica.summary(10) == {1, 2, 9, 8} and replica.summary(2) == {9, 8}  # the most recent, prefix-closed
    replica.touch([1, 2, 5])  # 1 and 2 are the most recent again; 8 (a leaf) leaves, then 9
    assert replica.summary(10) == {1, 2, 5, 9}


def test_bounded_hash_never_passes_its_cap():
    n, policy = 5, BoundedHash(5, random.Random(0), 16)
    replicas = [rep.Replica(10, 16) for _ in range(n)]
    live = []
    rng = random.Random(1)
    for i in range(500):
        req = request(i, 64, 1, keys=[7, 8, 9, 10])  # one hot prefix: the ring alone would send all to one
        req.replica = policy.choose(req, replicas)
        policy.routed(req)
        live.append(req)
        assert max(policy.inflight) <= math.ceil(1.25 * policy.total / n) + 1
        if rng.random() < 0.5:
            policy.finished(live.pop(rng.randrange(len(live))))
    assert sum(x > 0 for x in policy.inflight) >= 4  # the hot key overflowed along the ring


def test_same_seed_same_result():
    a, b = (dataclasses.replace(sim.simulate(sim.Ours, 4, seed=5, workload="mix+preamble"), sim_s=0, route_us=0)
            for _ in range(2))
    assert a == b


def test_cache_aware_policies_beat_load_only_ones_on_hits():
    results = {cls.__name__: sim.simulate(cls, 4, seed=1, workload="short") for cls in sim.POLICIES}
    ours, p2c = results["Ours"], results["PowerOfTwo"]
    assert ours.hit_rate > p2c.hit_rate + 0.2
    assert all(r.hit_rate <= r.ideal_hit_rate + 1e-9 for r in results.values())  # never above one infinite cache
    assert all(r.num_requests > 100 and r.max_over_mean >= 1 and r.p99_ttft_s is None for r in results.values())


def test_stream_keys_chain_like_block_digests():
    a = Stream(16).extend(1, 20)  # 1 full block + 4 tokens
    b = a.extend(2, 12)  # completes block 2
    assert len(a.keys) == 1 and a.tail_len == 4 and b.keys[0] == a.keys[0] and len(b.keys) == 2
    assert Stream(16).extend(1, 32).keys[1] != Stream(16).extend(9, 16).extend(1, 16).keys[1]


def test_a_mooncake_format_trace_replays(tmp_path):
    path = write_synthetic_trace(tmp_path / "trace.jsonl", 300, seed=2)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert set(rows[0]) == {"timestamp", "input_length", "output_length", "hash_ids"}
    assert all(r["hash_ids"][0] == 0 for r in rows)  # a shared preamble block
    assert all(len(r["hash_ids"]) == -(-r["input_length"] // 512) for r in rows)
    workload = read_trace(path, block_size=512)
    assert len(workload.sessions) == 300
    keys, prompt, _ = workload.sessions[0].fixed[0]
    assert len(keys) == prompt // 512 and keys == chain(rows[0]["hash_ids"])[: prompt // 512]
    trace = f"trace:{path}"
    results = {cls.__name__: sim.simulate(cls, 4, seed=0, workload=trace) for cls in (sim.Ours, BoundedHash)}
    assert results["Ours"].num_requests >= 250 and results["Ours"].hit_rate > 0.3
    assert results["Ours"].hit_rate <= results["Ours"].ideal_hit_rate + 1e-9


def test_the_report_prints_tables_and_verdicts(capsys, tmp_path):
    assert sim.main(["--replicas", "4", "--seeds", "2", "--workloads", "short", "--out", str(tmp_path / "r.md")]) == 0
    out = capsys.readouterr().out
    assert "| 4 | ours (CacheAwareRouter) |" in out and "machine:" in out and "Targets held:" in out
    assert "- short, 4 replicas: hit" in out and (tmp_path / "r.md").read_text().strip() == out.strip()
    assert "| short | 4 | " in out  # the summary row: ours against the best baselines and the oracle


def test_a_replica_records_its_cache_events_once_asked():
    replica = rep.Replica(capacity_blocks=3, block_size=16)
    replica.touch([1, 2])
    assert replica.event_kinds is None  # not recording yet
    assert replica.take_events() == rep.SimEvents(b"", [])
    replica.touch([1, 3])  # parents last: 3 then 1 (already held)
    replica.touch([4])  # over capacity: the least recent leaf, 2, goes
    stored, removed = rep.STORED, rep.REMOVED
    assert replica.take_events() == rep.SimEvents(bytes([stored, stored, removed]), [3, 4, 2])
    assert replica.take_events() == rep.SimEvents(b"", [])


def test_events_between_summaries_are_counted_on_the_wire():
    base = sim.simulate(sim.Ours, 4, seed=3, workload="short")
    events = sim.simulate(sim.Ours, 4, seed=3, workload="short", event_period=0.1)
    rare = sim.simulate(sim.Ours, 4, seed=3, workload="short", report_period=10.0, event_period=0.1)
    again = sim.simulate(sim.Ours, 4, seed=3, workload="short", report_period=10.0, event_period=0.1)
    assert base.event_share == 0 and 0 < events.event_share < rare.event_share < 1
    assert events.reports_s > base.reports_s and rare.report_bytes_s < base.report_bytes_s / 4
    assert dataclasses.replace(rare, sim_s=0, route_us=0) == dataclasses.replace(again, sim_s=0, route_us=0)
    assert all(r.num_requests == base.num_requests for r in (events, rare))


def test_paired_differences_are_seed_by_seed_and_a_straddling_range_is_a_tie():
    from benchmarks.routing.report import OURS, RAY, paired

    def run(policy, workload, seed, hit, p99=1.0):
        return sim.Result(workload, policy, 8, seed, 1000, hit, 0.9, 0.1, p99, 0.5, 1.0, 0.8, 0.0, 0.0)

    results = [run(OURS, "mix", 0, 0.70), run(RAY, "mix", 0, 0.71), run(OURS, "mix", 1, 0.80, 1.1),
               run(RAY, "mix", 1, 0.82), run(OURS, "long", 0, 0.70), run(RAY, "long", 0, 0.71),
               run(OURS, "long", 1, 0.81), run(RAY, "long", 1, 0.80), run(OURS, "long", 2, 0.5)]  # seed 2: unpaired
    rows = paired(results)[2:]
    assert len(rows) == 2
    assert "| mix | 8 | 2 |" in rows[0] and "-1.50 (-2.00..-1.00)" in rows[0] and "+50.0 (+0.0..+100.0)" in rows[0]
    assert rows[0].endswith("ours lower, every seed |")
    assert "| long | 8 | 2 |" in rows[1] and "+0.00 (-1.00..+1.00)" in rows[1] and rows[1].endswith("tie (straddles 0) |")
    assert paired(results[:1]) == []  # one seed: nothing to pair


def _choice(session, arrival, prompt, hit, replica, keys, output=1, reason="", best=0, chosen=0, view=(-1, -1)):
    return Choice(session, 0, arrival, prompt, output, hit, replica, reason, best, chosen, view[0], view[1], 0.1,
                  list(keys))


def test_work_bounds_lpt_groups_and_greedy_on_a_hand_made_run():
    # Longest first, to the lighter: 5 | 4, 3 -> 4, 3 -> 5, 3 -> 7: {5, 3} {4, 3, 3} = 10 (the best is 9: within 4/3)
    assert lpt_max([5, 4, 3, 3, 3], 2) == 10
    # Two replicas. Request 1 reuses request 0's two blocks on replica 0 (a group); 2 and 3 are alone
    run = [_choice(0, 0.0, 40, 0, 0, [1, 2, 3, 4]), _choice(1, 1.0, 40, 20, 0, [1, 2, 7, 8]),
           _choice(2, 2.0, 10, 0, 1, [9]), _choice(3, 3.0, 60, 0, 1, [5, 6, 11, 12, 13, 14])]
    b = work_bounds(run, num_replicas=2, block_size=10)
    # work = prompt - hit (+ output - 1 = 0): 40, 20, 10, 60 -> replica 0: 60, replica 1: 70, mean 65
    assert b.mean_work == 65 and b.ours == pytest.approx(70 / 65)
    assert b.offline_lpt == pytest.approx(70 / 65)  # {60, 10} {40, 20}
    assert b.num_groups == 3 and b.largest_group == pytest.approx(60 / 65)  # {0, 1}: 60 tokens
    # Online, arrival order: 40 -> r0, 20 -> r1, 10 -> r1, 60 -> r1 (30 < 40): {40}, {90}
    assert b.online_greedy == pytest.approx(90 / 65)
    assert [round(r.work, 3) for r in b.large] == [round(40 / 65, 3), round(20 / 65, 3), round(60 / 65, 3)]
    assert b.large[-1].lightest_ours == pytest.approx(10 / 65) and b.large[-1].lightest_greedy == pytest.approx(30 / 65)


def test_attribution_charges_each_hit_difference_to_the_rule_behind_ours_choice():
    ours = [_choice(0, 0.0, 100, 50, 0, [], reason="affinity", best=5, chosen=5, view=(5, 5)),
            _choice(1, 1.0, 100, 20, 1, [], reason="affinity", best=5, chosen=2, view=(5, 2)),  # past a bound
            _choice(2, 2.0, 100, 20, 1, [], reason="affinity", best=5, chosen=2, view=(2, 2)),  # view behind
            _choice(3, 3.0, 9000, 0, 0, [], reason="low_gain", best=3, chosen=0, view=(3, 0))]
    theirs = [_choice(0, 0.0, 100, 40, 0, []), _choice(1, 1.0, 100, 50, 0, []), _choice(2, 2.0, 100, 50, 0, []),
              _choice(3, 3.0, 9000, 30, 0, [])]
    rows = {(r.rule, r.prompts): r.hit_tokens_diff for r in attribute(ours, theirs, warmup=0.0)}
    assert rows == {("at the deepest true holder", "short"): 10,
                    ("affinity: the deepest holder past a bound, a shallower one taken", "short"): -30,
                    ("affinity: the deepest holder's blocks missing from the router's view", "short"): -30,
                    ("low_gain: the match < 20% of the prompt, the lightest less its saving taken", "long"): -30}


def test_a_recorded_run_gives_the_same_result_and_one_choice_per_request():
    plain = sim.simulate(Ours, 4, 0, workload="mix")
    result, choices = run_recorded(sim.simulate, Ours, 4, 0, workload="mix")
    assert dataclasses.replace(result, sim_s=0, route_us=0) == dataclasses.replace(plain, sim_s=0, route_us=0)
    assert len(choices) == len({(c.session, c.turn) for c in choices}) >= sim.MIN_REQUESTS
    assert all(0 <= c.chosen_blocks <= c.best_blocks and c.reason for c in choices)
    work = sum(c.work_tokens for c in choices)  # every token a replica computed belongs to one request
    assert work == pytest.approx(result.max_work_tokens / result.max_over_mean * 4)
