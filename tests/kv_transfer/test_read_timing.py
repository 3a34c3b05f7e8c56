"""A disk-tier load's outcome does not depend on how long its background read takes (issue 39).

The reader thread's result is taken in whatever step it finishes before; a gate (`GatedReads`) holds it until a
chosen step, so each interleaving happens every run: done before the first step, while running requests hold the
whole pool, or after they ended. Before the fix, a result taken while the pool was full ended the load with 0 of
its blocks written (recomputed), and one taken after the tree evicted the blocks before the load's first was dropped.
"""

from __future__ import annotations

import threading

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import TransferCostModel
from tests.kv_transfer.test_engine_transfer import BS, transfer_stats
from tests.tiny_models import ragged_prompts, run_engine, stock_greedy

DOC_BLOCKS = 5  # full blocks of the document the disk holds
RELEASES = {"read before the first step": 0, "read while the pool is full": 3, "read after the others ended": 40}


class GatedReads:
    """The connector's reads (its reader thread's store) held until the test opens `gate` (120 s at most: a bound
    against a hang, far past any step count a loaded machine takes to reach the release)."""

    def __init__(self, store) -> None:
        self.store, self.gate = store, threading.Event()

    def get(self, key):
        self.gate.wait(120)
        return self.store.get(key)


@pytest.fixture(scope="module")
def doc_prompt():
    return ragged_prompts([DOC_BLOCKS * BS], seed=40)[0] + ragged_prompts([3], seed=41)[0]


@pytest.fixture(scope="module")
def fillers():
    return ragged_prompts([30, 30], seed=42)  # 2 x (30 + 24) tokens: 14 blocks wanted from a pool of 12


@pytest.fixture(scope="module")
def expected(model, doc_prompt, fillers):
    return stock_greedy(model, [doc_prompt], 6) + stock_greedy(model, fillers, 24)


def gated_engine(model, directory, preemption_mode) -> tuple[Engine, GatedReads]:
    engine = Engine(model, PagedConfig(block_size=BS, num_blocks=12, kv_offload_dir=str(directory),
                                       max_num_batched_tokens=32, preemption_mode=preemption_mode))
    connector = engine.scheduler.kv_transfer
    connector.cost = TransferCostModel(learn=False)  # loads win (the priors, frozen): the same choice every run
    gated = connector.fetcher.store = GatedReads(connector.fetcher.store)
    return engine, gated


def on_disk(engine, gated, prompt, expected) -> None:
    """Compute `prompt` (its blocks cached), then evict them to disk."""
    gated.gate.set()
    assert run_engine(engine, [prompt], 6) == expected
    run_engine(engine, ragged_prompts([90], seed=99), 1)
    assert engine.scheduler.kv_transfer.flush(10)
    assert engine.kv.prefix_cache.peek(prompt) == 0


def run_released_at(engine, gated, release: int, requests: list[tuple[list[int], int]]) -> list:
    """Add `requests` (prompt, new tokens), hold the reads until step `release`, then wait for them and go on."""
    gated.gate.clear()
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=n)) for p, n in requests]
    steps = 0
    while engine.has_unfinished:
        if steps == release:
            gated.gate.set()
            engine.scheduler.kv_transfer.wait(60)  # the read is finished before this step asks for it
        engine.step()
        engine.check_integrity()
        steps += 1
    assert steps > release  # the release happened
    return [engine.pop_output(i) for i in ids]


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_a_load_taken_while_the_pool_is_full_waits_for_room(model, tmp_path, doc_prompt, fillers, expected,
                                                            preemption_mode):
    """Two fillers hold the whole pool and preempt each other; the document's request arrives then, its 5 blocks on
    disk. However late its read comes back, all 5 are loaded and none is recomputed."""
    outcomes = {}
    for name, release in RELEASES.items():
        engine, gated = gated_engine(model, tmp_path / name, preemption_mode)
        on_disk(engine, gated, doc_prompt, expected[:1])
        filler_ids = [engine.add_request(f, SamplingParams(max_new_tokens=24)) for f in fillers]
        while engine.cache.pool.num_free_blocks:  # the fillers take every block
            engine.step()
        before = transfer_stats(engine)["loaded_blocks"]
        outs = run_released_at(engine, gated, release, [(doc_prompt, 6)])
        outs += [engine.pop_output(i) for i in filler_ids]
        stats = transfer_stats(engine)
        assert [o.generated_tokens for o in outs] == expected, name
        assert stats["load_failures"] == 0 and stats["rejected_blocks"] == 0, (name, stats)
        assert engine.stats()["preemptions"] > 0 and engine.cache.pool.num_used_blocks == 0
        outcomes[name] = (stats["loaded_blocks"] - before, outs[0].num_cached_tokens)
        if release < 40:  # its result was taken while the fillers held the pool: the load waited for room
            assert stats["load_waits"] > 0, (name, stats)
    assert set(outcomes.values()) == {(DOC_BLOCKS, DOC_BLOCKS * BS)}, outcomes


@pytest.mark.parametrize("preemption_mode", ["recompute", "swap"])
def test_a_load_whose_local_hit_was_evicted_meanwhile_reads_the_missing_head(model, tmp_path, doc_prompt, fillers,
                                                                              expected, preemption_mode):
    """The document's first 2 blocks are cached here, its other 3 on disk: the read asks for those 3. While it runs
    (or the load waits for room) the fillers evict the 2, which go to disk: the load reads them back and keeps the 3
    it read, so the whole document is loaded or hit however late the read comes back."""
    head = ragged_prompts([DOC_BLOCKS * BS], seed=40)[0][: 2 * BS] + ragged_prompts([5], seed=43)[0]
    outcomes = {}
    for name, release in RELEASES.items():
        engine, gated = gated_engine(model, tmp_path / name, preemption_mode)
        on_disk(engine, gated, doc_prompt, expected[:1])
        run_engine(engine, [head], 1)  # blocks 0, 1 of the document come back from disk: a local hit of 2
        assert engine.kv.prefix_cache.peek(doc_prompt) == 2 * BS
        outs = run_released_at(engine, gated, release, [(doc_prompt, 6), (fillers[0], 24), (fillers[1], 24)])
        stats = transfer_stats(engine)
        assert [o.generated_tokens for o in outs] == expected, name
        assert stats["load_failures"] == 0 and stats["rejected_blocks"] == 0, (name, stats)
        outcomes[name] = (outs[0].num_cached_tokens, stats["reread_loads"] > 0)
    assert outcomes == {"read before the first step": (DOC_BLOCKS * BS, False),  # the 2 still cached: 3 loaded
                        "read while the pool is full": (DOC_BLOCKS * BS, True),
                        "read after the others ended": (DOC_BLOCKS * BS, True)}, outcomes
