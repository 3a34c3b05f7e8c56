"""CacheAwareRouter: exact unit tests of each rule (affinity, relative load bounds, shared prefixes, hot prefixes,
membership)."""

from __future__ import annotations

import pytest

from hf_paged.scaleout import CacheAwareRouter, PrefixTraffic, RouterConfig, RouteReason, RouteRequest

BS = 4


def router(*replicas, seed: int = 0, **config) -> CacheAwareRouter:
    r = CacheAwareRouter(RouterConfig(block_size=BS, **config), seed=seed)
    for replica in replicas:
        r.add_replica(replica)
    return r


def request(rid, digests, output=0) -> RouteRequest:
    return RouteRequest(rid, list(digests), num_prompt_tokens=len(digests) * BS + 1, num_output_tokens=output)


def send(r: CacheAwareRouter, req: RouteRequest, candidates=None):
    decision = r.route(req, candidates)
    r.on_routed(req, decision.replica_ids[0], decision)
    r.check_integrity()
    return decision


def test_affinity_goes_to_the_longest_reported_prefix():
    r = router("a", "b", "c")
    r.report("a", keys={1}, load_tokens=0)
    r.report("b", keys={1, 2, 3}, load_tokens=0)
    decision = r.route(request("q", [1, 2, 3, 4]))
    assert decision.replica_ids[0] == "b"
    assert (decision.reason, decision.num_cached_blocks, decision.prefix_key) == (RouteReason.AFFINITY, 3, 3)
    assert len(set(decision.replica_ids)) == len(decision.replica_ids)


def test_nothing_cached_anywhere_is_power_of_two_on_load():
    r = router("a", "b")
    r.report("a", keys=set(), load_tokens=500)
    r.report("b", keys=set(), load_tokens=10)
    decision = r.route(request("q", [7, 8]))
    assert decision.reason is RouteReason.NO_MATCH and decision.prefix_key is None
    assert decision.replica_ids == ["b", "a"]  # two replicas: both drawn, the lighter first
    assert r.route(request("q", [])).reason is RouteReason.NO_MATCH  # shorter than a block


def test_what_the_router_sent_counts_as_cached_until_two_reports_later():
    r = router("a", "b")
    first = send(r, request("q1", [1, 2, 3], output=8))
    home = first.replica_ids[0]
    again = r.route(request("q2", [1, 2, 3, 9]))
    assert again.replica_ids[0] == home and again.num_cached_blocks == 3  # no report yet: the router's own record
    r.report(home, keys=set(), load_tokens=0)  # this snapshot may predate the request: still assumed
    assert r.route(request("q3", [1, 2])).replica_ids[0] == home
    r.report(home, keys=set(), load_tokens=0)  # two periods on, the replica's own report is the truth
    assert r.route(request("q4", [1, 2])).reason is RouteReason.NO_MATCH


def test_load_estimate_is_the_report_plus_sent_minus_finished():
    r = router("a")
    r.report("a", keys={1, 2}, load_tokens=100)
    req = RouteRequest("q", [1, 2, 3], num_prompt_tokens=14, num_output_tokens=5)
    send(r, req)
    assert r.load_of("a") == 100 + (14 - 2 * BS) + 5  # only the uncached part of the prompt adds load
    r.on_finished("q")
    assert r.load_of("a") == 100
    r.on_finished("q")  # twice, or unknown: ignored
    r.on_finished("never")
    assert r.load_of("a") == 100


def test_affinity_yields_to_queueing_imbalance():
    r = router("a", "b", "c", queue_factor=1.0)
    r.report("a", keys={1, 2}, load_tokens=13)
    r.report("b", keys=set(), load_tokens=0)
    r.report("c", keys=set(), load_tokens=0)
    # 9 prompt tokens, 8 of them cached on "a": its 13 queued tokens exceed the mean load (13/3) + the 8 saved
    decision = r.route(request("q", [1, 2]))
    assert decision.reason is RouteReason.IMBALANCED and "a" not in decision.replica_ids[:1]
    r.report("a", keys={1, 2}, load_tokens=12)  # at the bound (12/3 + 8): still fits
    assert r.route(request("q", [1, 2])).reason is RouteReason.AFFINITY


@pytest.mark.parametrize("prompt_tokens, ahead, reason", [
    (30_000, 12_000, RouteReason.AFFINITY),  # 12k tokens queued ahead to save 30k of prefill: worth it
    (496, 4_000, RouteReason.IMBALANCED),  # 4k tokens queued ahead to save 496: not worth it
])
def test_the_queue_bound_is_relative_to_the_prefill_saved(prompt_tokens, ahead, reason):
    # The same rule for 500-token and 30k-token prompts (an absolute bound in tokens gets one of them wrong).
    block = 16
    r = CacheAwareRouter(RouterConfig(block_size=block), seed=0)
    digests = list(range(1, prompt_tokens // block + 1))
    for replica in "abcd":
        r.add_replica(replica)
        r.report(replica, keys=set(digests) if replica == "a" else set(), load_tokens=ahead if replica == "a" else 0)
    decision = r.route(RouteRequest("q", digests, num_prompt_tokens=prompt_tokens, num_output_tokens=0))
    assert decision.reason is reason
    assert (decision.replica_ids[0] == "a") is (reason is RouteReason.AFFINITY)


def test_the_slack_is_one_mean_request_whatever_its_size():
    for size in (8, 8_000):  # tokens of output per request: the bound scales with what requests weigh
        r = router("a", "b", queue_factor=0.0)
        for i in range(20):
            send(r, request(f"w{i}", [1000 + i], output=size), candidates=["a" if i % 2 else "b"])
        assert r.mean_request_tokens == pytest.approx(size + 5, rel=0.01)
        r.report("a", keys={1, 2}, load_tokens=0)
        r.report("b", keys=set(), load_tokens=0)
        for k in range(2):  # a runs two requests ahead of b: one above the mean load of the two, still fits
            r.on_routed(request(f"x{k}", [1, 2], output=size), "a")
        assert r.route(request("q", [1, 2, 3])).reason is RouteReason.AFFINITY
        r.on_routed(request("y", [1, 2], output=size), "a")  # three ahead: past the bound
        assert r.route(request("q", [1, 2, 3])).reason is RouteReason.IMBALANCED


def test_a_preamble_every_replica_holds_is_no_affinity():
    # A chat template's text starts every prompt, so every replica holds its blocks (1, 2): matching them is no
    # reason to pick a replica, and the preamble never becomes a (hot) prefix key.
    r = router("a", "b", "c", "d")
    for replica in "abcd":
        r.report(replica, keys={1, 2, 3} if replica == "c" else {1, 2}, load_tokens=0)
    fresh = send(r, request("new system prompt", [1, 2, 7, 8, 9]))
    assert (fresh.reason, fresh.prefix_key, fresh.num_replicas_wanted) == (RouteReason.LOW_GAIN, None, 1)
    known = r.route(request("known system prompt", [1, 2, 3, 4]))
    assert (known.replica_ids[0], known.reason, known.prefix_key) == ("c", RouteReason.AFFINITY, 3)
    assert len(r.traffic) == 0  # nothing tracked: the preamble is not a prefix anyone routes by


def test_a_match_of_a_small_share_of_the_prompt_is_no_affinity():
    r = router("a", "b", min_gain_share=0.1)
    r.report("a", keys={1}, load_tokens=0)
    long = request("long", [1, *range(100, 120)])  # 1 block of 21 cached: 5% of the prompt
    assert r.route(long).reason is RouteReason.LOW_GAIN
    short = request("short", [1, 100, 101])  # 1 block of 3: 31%
    assert r.route(short).replica_ids[0] == "a" and r.route(short).reason is RouteReason.AFFINITY


def test_a_match_is_weighed_by_the_prefill_it_saves():
    # "a" holds more of the prompt but is past the work bound; "b" holds less and fits: "b" saves the most of
    # the replicas that may take it.
    r = router("a", "b", "c", "d", balance_factor=1.2, queue_factor=1e9, hot_threshold=100.0)
    for i in range(8):
        send(r, request(f"a{i}", [500 + i], output=100), candidates=["a"])
        r.on_finished(f"a{i}")
    r.report("a", keys={1, 2, 3}, load_tokens=0)
    r.report("b", keys={1, 2}, load_tokens=0)
    decision = r.route(request("q", [1, 2, 3, 4]))
    assert decision.replica_ids[0] == "b" and decision.reason is RouteReason.AFFINITY
    assert decision.num_cached_blocks == 2 and decision.prefix_key == 3  # the key is still the deepest match


def test_affinity_yields_to_long_run_work_imbalance():
    # Replica "a" holds the prefix, but has been sent far more than the mean recently: bounded loads.
    r = router("a", "b", "c", "d", balance_factor=1.2, queue_factor=1e9,
               hot_threshold=100.0)  # hot spreading off: this test is about the work bound alone
    r.report("a", keys={1, 2}, load_tokens=0)
    for i in range(6):
        send(r, request(f"a{i}", [1, 2, 100 + i], output=100), candidates=["a"])
        r.on_finished(f"a{i}")
    assert r.work_share("a") == pytest.approx(1.0)
    assert r.route(request("q", [1, 2, 5])).reason is RouteReason.IMBALANCED
    for i in range(40):  # work sent elsewhere lowers a's share below the bound again
        for other in "bcd":
            send(r, request(f"{other}{i}", [50 + i], output=100), candidates=[other])
    assert r.work_share("a") < 1.2 / 4
    assert r.route(request("q", [1, 2, 5])).reason is RouteReason.AFFINITY


def test_a_hot_prefix_is_spread_over_more_replicas():
    n = 4
    r = router(*range(n), hot_threshold=1.0, queue_factor=1e9, balance_factor=100.0)
    system = [1, 2, 3]
    homes = []
    for i in range(200):  # every request shares the system prompt: its share is 100%, it wants all 4 replicas
        decision = send(r, request(i, [*system, 1000 + i], output=16))
        homes.append(decision.replica_ids[0])
        r.on_finished(i)
    reasons = r.num_routed
    assert reasons[RouteReason.HOT_ADMIT] >= n - 1 and set(homes) == set(range(n))
    assert r.traffic.replicas_wanted(system[-1], n, 1.0) == n
    # Once every replica holds it, the prefix is shared: routed by load, on any replica, without a key.
    assert reasons[RouteReason.LOW_GAIN] > 100 and set(homes[-50:]) == set(range(n))
    assert r.route(request("x", [*system, 5])).prefix_key is None


def test_a_cold_prefix_stays_on_one_replica():
    r = router(*range(8))
    send(r, request("warm", [1, 2, 3], output=16))
    for i in range(20):  # 20 requests of 1 prefix among 2000 of others: far below one replica's share
        for j in range(100):
            send(r, request(f"o{i}-{j}", [10_000 + i * 100 + j], output=16))
            r.on_finished(f"o{i}-{j}")  # requests end: the queue bound compares what is still running
        decision = send(r, request(f"p{i}", [1, 2, 3, 4 + i], output=16))
        r.on_finished(f"p{i}")
        assert decision.num_replicas_wanted == 1 and decision.reason is RouteReason.AFFINITY


def test_removed_replica_is_forgotten_at_once():
    r = router("a", "b")
    r.report("a", keys={1, 2}, load_tokens=0)
    send(r, request("q", [1, 2], output=4))
    r.remove_replica("a")
    assert r.replica_ids == ["b"]
    assert r.route(request("q2", [1, 2])).replica_ids == ["b"]
    assert r.report("a", keys={1, 2}, load_tokens=0) is False  # a late report does not bring it back
    assert r.replica_ids == ["b"]
    r.on_finished("q")  # its in-flight request ends later: ignored
    r.on_routed(request("late", [1]), "a")  # a choice made before the removal lands after it: ignored
    assert r.replica_ids == ["b"]
    r.add_replica("a")  # back (Ray brought up a replacement): it starts empty
    assert r.load_of("a") == 0 and r.work_share("a") == 0


def test_candidates_restrict_the_choice_and_unknown_ids_are_skipped():
    r = router("a", "b", "c")
    r.report("a", keys={1}, load_tokens=0)
    decision = r.route(request("q", [1]), candidates=["b", "c", "zzz"])
    assert set(decision.replica_ids) <= {"b", "c"} and decision.reason is RouteReason.NO_MATCH
    with pytest.raises(ValueError, match="add_replica"):
        r.route(request("q", [1]), candidates=["zzz"])
    with pytest.raises(ValueError, match="add_replica"):
        router().route(request("q", [1]))


def test_sync_replicas_adds_and_forgets():
    r = router("a", "b")
    r.sync_replicas(["b", "c"])
    assert sorted(r.replica_ids) == ["b", "c"]


def test_same_seed_same_choices():
    def run(seed):
        r = router(*range(10), seed=seed)
        return [send(r, request(i, [i % 7, 100 + i], output=8)).replica_ids for i in range(50)]

    assert run(3) == run(3)
    assert run(3) != run(4)


@pytest.mark.parametrize("bad, message", [
    (dict(block_size=0), "block_size"), (dict(queue_factor=-1), "queue_factor"),
    (dict(min_gain_share=1.5), "min_gain_share"), (dict(shared_share=-0.1), "shared_share"),
    (dict(balance_factor=0.9), "balance_factor"), (dict(hot_threshold=0), "hot_threshold"),
    (dict(traffic_half_life=0), "traffic_half_life"), (dict(balance_half_life=-1), "balance_half_life"),
    (dict(block_size=True), "block_size"),
])
def test_config_errors_name_the_field(bad, message):
    with pytest.raises(ValueError, match=message):
        RouterConfig(**bad)


def test_prefix_traffic_shares_decay_and_prune():
    traffic = PrefixTraffic(half_life=10, max_keys=4)
    traffic.track("s")
    for _ in range(10):
        traffic.add(["s", "x"], 1.0)
    assert traffic.share("s") == pytest.approx(1.0) and traffic.share("x") == 0.0
    for _ in range(10):  # ten requests later, the old ones weigh half of the new ones
        traffic.add(["y"], 1.0)
    assert traffic.share("s") == pytest.approx(1 / 3, rel=0.05)
    assert traffic.replicas_wanted("s", num_replicas=9, hot_threshold=1.0) == 3
    assert traffic.replicas_wanted("nope", num_replicas=9, hot_threshold=1.0) == 1
    for key in "abcde":
        traffic.track(key)
    traffic.add(["a"], 1.0)
    assert len(traffic) <= 4 and traffic.share("s") > 0  # the busiest stay
    with pytest.raises(ValueError, match="half_life"):
        PrefixTraffic(half_life=0)


def test_work_decay_survives_rescaling():
    r = router("a", "b", balance_half_life=0.01)  # inflation overflows after a few requests: rescaled, shares kept
    for i in range(300):
        send(r, request(i, [i], output=10), candidates=["a" if i % 3 else "b"])
    assert r.work_share("a") + r.work_share("b") == pytest.approx(1.0)


def test_view_match_is_what_the_router_believes_a_replica_holds():
    r = router("a", "b")
    r.report("a", keys={1, 2}, load_tokens=0)
    send(r, request("q", [7, 8, 9]), candidates=["b"])
    assert (r.view_match("a", [1, 2, 3]), r.view_match("b", [7, 8, 5]), r.view_match("b", [1])) == (2, 2, 0)
