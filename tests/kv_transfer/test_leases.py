"""Blocks put for another engine that nobody collects are freed: bounded by count, bytes, and (optionally) time."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig
from hf_paged.kv_transfer import DirectoryStore, InProcessStore
from hf_paged.kv_transfer.leases import LeasedStore
from tests.kv_transfer.test_engine_transfer import BS, MAX_NEW, run, transfer_stats
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_uncollected_blocks_are_bounded_by_count_oldest_first():
    store = LeasedStore(InProcessStore(), max_blocks=2)
    for key in (b"a", b"b"):
        assert store.put(key, b"x" * 10)
    assert store.get(b"a") == b"x" * 10  # collected: no longer leased, stays in the store
    assert store.put(b"c", b"y" * 10) and store.put(b"d", b"z" * 10)  # b, c, d uncollected: b is freed
    assert [store.contains(k) for k in (b"a", b"b", b"c", b"d")] == [True, False, True, True]
    stats = store.stats
    assert (stats.leased_blocks, stats.leased_bytes, stats.collected_blocks, stats.expired_blocks) == (2, 20, 1, 1)
    assert store.put(b"c", b"y" * 10) and store.stats.leased_blocks == 2  # a repeated put takes no second lease
    store.delete(b"c")
    assert store.stats.leased_blocks == 1 and not store.contains(b"c")


def test_uncollected_bytes_are_bounded():
    store = LeasedStore(InProcessStore(), max_bytes=25)
    for key in (b"a", b"b", b"c"):
        store.put(key, bytes(10))
    assert not store.contains(b"a") and store.contains(b"b") and store.stats.expired_bytes == 10


def test_a_lease_times_out_on_an_injected_clock(tmp_path):
    clock = Clock()
    store = LeasedStore(DirectoryStore(tmp_path, 2**20), lease_seconds=30, clock=clock)
    store.put(b"old", bytes(8))
    clock.now = 20
    store.put(b"new", bytes(8))
    assert store.contains(b"old") and store.contains(b"new")
    clock.now = 30  # old's lease ends; new has 10 s left
    assert not store.contains(b"old") and store.contains(b"new")
    assert not (tmp_path / f"{b'old'.hex()}.kvb").exists()
    assert store.get(b"new") == bytes(8)  # collected before its time: kept
    clock.now = 1000
    assert store.contains(b"new") and store.expire() == 0 and store.stats.expired_blocks == 1


@pytest.mark.parametrize("bad", [{"max_blocks": 0}, {"max_bytes": -1}, {"lease_seconds": 0}, {"max_blocks": True},
                                 {}])
def test_bad_bounds_are_typed_errors(bad):
    with pytest.raises(ValueError, match="LeasedStore"):
        LeasedStore(InProcessStore(), **bad)


def test_a_prefill_engines_uncollected_blocks_are_freed_and_collected_ones_load():
    model = tiny_model("llama")
    system = ragged_prompts([45], seed=21)[0]
    prompts = [system + q for q in ragged_prompts([3, 11], seed=22)]
    expected = stock_greedy(model, prompts, MAX_NEW)
    inner = InProcessStore()
    store = LeasedStore(inner, max_blocks=8)
    prefill = Engine(model, PagedConfig(block_size=BS), kv_store=store)
    assert run(prefill, prompts) == expected
    # the prompts and their outputs: 8 full blocks offered, at most 8 uncollected
    assert store.stats.leased_blocks == 8 and store.stats.expired_blocks == 0
    decode = Engine(model, PagedConfig(block_size=BS), kv_store=store)
    assert run(decode, prompts[:1]) == expected[:1]
    assert transfer_stats(decode)["loaded_blocks"] == 5 and store.stats.collected_blocks == 5
    run(prefill, ragged_prompts([30, 30], seed=5))  # 8 more blocks nobody will collect
    assert store.stats.leased_blocks == 8 and store.stats.expired_blocks == 3  # the 3 oldest uncollected freed
    later = Engine(model, PagedConfig(block_size=BS), kv_store=store)
    assert run(later, prompts[:1]) == expected[:1]
    assert transfer_stats(later)["loaded_blocks"] == 5  # collected blocks stay (under the store's own bound)
