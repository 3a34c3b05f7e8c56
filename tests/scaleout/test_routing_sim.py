"""The routing simulator runs small, is deterministic with a seed, and ranks policies as the full run does."""

from __future__ import annotations

import dataclasses

import pytest

from benchmarks import routing_sim as sim


@pytest.fixture(autouse=True)
def small(monkeypatch):
    monkeypatch.setattr(sim, "REQUESTS_PER_REPLICA", 60)


def test_same_seed_same_result():
    a, b = (dataclasses.replace(sim.simulate(sim.Ours, 4, seed=5, load=0.9), sim_s=0, route_us=0) for _ in range(2))
    assert a == b


def test_cache_aware_policies_beat_load_only_ones_on_hits():
    results = {cls.name: sim.simulate(cls, 4, seed=1, load=0.9) for cls in sim.POLICIES}
    ours, p2c = results[sim.Ours.name], results[sim.PowerOfTwo.name]
    assert ours.hit_rate > p2c.hit_rate + 0.2
    assert ours.hit_rate <= ours.ideal_hit_rate + 1e-9  # never above one infinite cache
    assert all(r.num_requests > 100 and 0 <= r.hit_rate <= 1 and r.max_over_mean >= 1 for r in results.values())


def test_stream_keys_chain_like_block_digests():
    a = sim.Stream().extend(1, 20)  # 1 full block + 4 tokens
    b = a.extend(2, 12)  # completes block 2
    assert len(a.keys) == 1 and a.tail_len == 4 and b.keys[0] == a.keys[0] and len(b.keys) == 2
    assert sim.Stream().extend(1, 32).keys[1] != sim.Stream().extend(9, 16).extend(1, 16).keys[1]


def test_the_report_prints_a_table(capsys):
    assert sim.main(["--replicas", "4"]) == 0
    out = capsys.readouterr().out
    assert "| 4 | ours (CacheAwareRouter) |" in out and "machine:" in out
    assert "the target is set for 100 replicas" in out
