"""The fetch-vs-recompute cost model (injected measurements: deterministic) and reads started when a request arrives."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import DirectoryStore
from hf_paged.kv_transfer.cost_model import TransferCostModel
from tests.kv_transfer.test_engine_transfer import BS, MAX_NEW, SlowDisk, disk_engine, evict_all, run, transfer_stats
from tests.tiny_models import ragged_prompts, run_engine, stock_greedy


def test_the_model_compares_bytes_over_bandwidth_with_tokens_over_prefill_speed():
    cost = TransferCostModel(bandwidth_prior=1e6, prefill_prior=1e3, prior_weight=1.0, decay=1.0, explore_every=0)
    assert cost.estimate(2_000, 10).fetch_seconds == pytest.approx(0.002)
    assert cost.estimate(2_000, 10).recompute_seconds == pytest.approx(0.01)
    assert cost.should_load(2_000, 10) and not cost.should_load(20_000, 10)
    cost.observe_load(1_000_000, 9.0)  # measured: 1e6 bytes in 9 s -> (1e6 + 1e6) / 10 s = 200 KB/s
    assert cost.bandwidth.per_second == pytest.approx(2e5)
    assert not cost.should_load(4_000, 10)  # 20 ms to fetch, 10 ms to recompute
    cost.observe_prefill(100, 99.0)  # prefill is slow after all: (1000 + 100) / 100 s = 11 tokens/s
    assert cost.should_load(4_000, 10)


def test_decay_follows_the_newest_measurements_and_exploration_retries():
    cost = TransferCostModel(bandwidth_prior=1e9, prefill_prior=1e3, prior_weight=0.01, decay=0.5, explore_every=3)
    for _ in range(20):
        cost.observe_load(1_000, 1.0)  # a very slow store: 1 KB/s
    assert cost.bandwidth.per_second < 2_000
    answers = [cost.should_load(10_000, 1) for _ in range(6)]
    assert answers == [False, False, True, False, False, True]  # every third refusal tries a load anyway


@pytest.mark.parametrize("bad", [{"decay": 0}, {"decay": 1.5}, {"explore_every": -1}, {"bandwidth_prior": 0},
                                 {"prefill_prior": -1.0}])
def test_bad_settings_are_value_errors(bad):
    with pytest.raises(ValueError):
        TransferCostModel(**bad)


def frozen(*, bandwidth: float, prefill: float) -> TransferCostModel:
    return TransferCostModel(bandwidth_prior=bandwidth, prefill_prior=prefill, explore_every=0, learn=False)


def test_recompute_wins_skips_the_load_and_changes_no_token(model, prompts, expected, tmp_path):
    engine = disk_engine(model, tmp_path)
    run(engine, prompts[:1])
    evict_all(engine)
    connector = engine.scheduler.kv_transfer
    connector.cost = frozen(bandwidth=1.0, prefill=1e9)  # a store at 1 B/s: never worth it
    assert run(engine, prompts) == expected
    stats = transfer_stats(engine)
    assert stats["loaded_blocks"] == 0 and stats["loads_skipped"] == 2 and stats["load_failures"] == 0
    connector.cost = frozen(bandwidth=1e12, prefill=1.0)
    evict_all(engine, seed=98)
    assert run(engine, prompts[:1]) == expected[:1]
    assert transfer_stats(engine)["loaded_blocks"] == 5


def test_the_engine_measures_its_loads_and_prefill_steps(model, prompts, expected, tmp_path):
    engine = disk_engine(model, tmp_path)
    run(engine, prompts[:1])
    evict_all(engine)
    assert run(engine, prompts[:1]) == expected[:1]
    stats = transfer_stats(engine)
    assert stats["cost_load_samples"] == 1 and stats["cost_prefill_samples"] >= 2
    assert stats["cost_bandwidth_bytes_per_s"] > 0 and stats["cost_prefill_tokens_per_s"] > 0


def test_a_read_starts_when_the_request_arrives(model, prompts, expected, tmp_path):
    store = SlowDisk(tmp_path, max_bytes=2**20)
    run(Engine(model, PagedConfig(block_size=BS), kv_store=store), prompts[:1])
    engine = Engine(model, PagedConfig(block_size=BS, max_num_seqs=1), kv_store=store)
    busy = engine.add_request(ragged_prompts([6], seed=7)[0], SamplingParams(max_new_tokens=6))
    rid = engine.add_request(prompts[0], SamplingParams(max_new_tokens=MAX_NEW))  # queued behind `busy`
    connector = engine.scheduler.kv_transfer
    assert rid in connector.fetcher and transfer_stats(engine)["prefetched_reads"] == 1  # before any step
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    assert engine.pop_output(rid).generated_tokens == expected[0]
    engine.pop_output(busy)
    assert transfer_stats(engine)["loaded_blocks"] == 5
    connector.close()
    assert not connector.has_threads


def test_prefetched_reads_are_bounded_by_the_pool(model, tmp_path):
    docs = ragged_prompts([40, 40, 40], seed=30)
    writer = disk_engine(model, tmp_path, num_blocks=64)
    run(writer, docs)
    assert writer.scheduler.kv_transfer.save_cached() == 15
    engine = disk_engine(model, tmp_path, num_blocks=12, max_num_seqs=1)  # 12 blocks: two prompts' 4 + 4 blocks
    ids = [engine.add_request(d + [5], SamplingParams(max_new_tokens=2)) for d in docs]
    assert engine.scheduler.kv_transfer.fetcher.num_blocks <= 12
    assert transfer_stats(engine)["prefetched_reads"] == 2  # the third would pass the pool: read at admission
    while engine.has_unfinished:
        engine.step()
    assert [engine.pop_output(i).error for i in ids] == [None] * 3
    assert transfer_stats(engine)["loaded_blocks"] == 15


def test_directory_store_reads_are_identical_with_prefetch_and_a_churning_pool(model, tmp_path):
    """Prefetched reads under preemption and partial-block copies: the pending copy of a shared partial block runs
    before a load writes over its source (the load's allocation may hand that very block out)."""
    import random

    docs = ragged_prompts([40, 56, 33], seed=40)
    rng = random.Random(0)
    prompts = [docs[rng.randrange(3)] + ragged_prompts([rng.randrange(1, 12)], seed=50 + i)[0] for i in range(8)]
    expected = stock_greedy(model, prompts, 6)
    engine = disk_engine(model, tmp_path, num_blocks=20, max_num_batched_tokens=32)
    for order in (range(4), range(4, 8), range(7, -1, -1)):
        assert run_engine(engine, [prompts[i] for i in order], 6) == [expected[i] for i in order]
    assert transfer_stats(engine)["prefetched_reads"] >= 1 and isinstance(
        engine.scheduler.kv_transfer.saver.store, DirectoryStore)
