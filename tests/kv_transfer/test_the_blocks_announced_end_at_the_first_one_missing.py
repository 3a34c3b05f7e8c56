"""The store's blocks past a local hit count only up to the first one it lacks (block i is only usable after blocks
0..i-1): a gap ends what is announced and read, so the load is whole, not a counted failure."""

from __future__ import annotations

from hf_paged import Engine, PagedConfig
from hf_paged.kv_transfer import InProcessStore
from tests.kv_transfer.test_engine_transfer import BS, run, transfer_stats


def test_a_gap_in_the_store_ends_the_blocks_announced(model, prompts, expected):
    store = InProcessStore()
    saver = Engine(model, PagedConfig(block_size=BS), kv_store=store)
    run(saver, prompts[:1])
    keys = saver.scheduler.kv_transfer._keys(saver.kv.prefix_cache.digests(prompts[0]))
    store.delete(keys[2])  # blocks 0, 1, then a gap, then 3, 4
    engine = Engine(model, PagedConfig(block_size=BS), kv_store=store)
    assert engine.scheduler.kv_transfer.num_external_blocks(prompts[0]) == 2
    assert run(engine, prompts[:1]) == expected[:1]
    stats = transfer_stats(engine)
    assert stats["loaded_blocks"] == 2 and stats["load_failures"] == 0
