"""A load whose head was evicted while its read waited reads the head again (`_reask`); the blocks kept from the
first read join the new head only when the head came back whole. A short head (a blob missing or refused) followed by
the kept blocks would put those blocks at the wrong table positions: K/V served under another prefix.
h89's mutation audit: the join's check replaced by True survived every test (no test reached a short re-read)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from types import SimpleNamespace

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.kv_transfer import DirectoryStore, TransferCostModel
from hf_paged.kv_transfer.fetcher import FetchResult, PendingFetch
from hf_paged.kv_transfer.paced_load import PacedLoads, StagedLoad
from tests.kv_transfer.test_engine_transfer import BS, run, transfer_stats
from tests.kv_transfer.test_paced_load import step_all
from tests.tiny_models import ragged_prompts, stock_greedy


def _loads(kept: StagedLoad) -> PacedLoads:
    loads = PacedLoads.__new__(PacedLoads)  # (no connector: `_from_fetch` only reads the result through `checked`)
    loads.c = SimpleNamespace(checked=lambda result: list(result.blocks))
    loads._staged, loads._written, loads._kept = {}, {}, {"seq": kept}
    return loads


def _fetch(first: int, blocks: list[str], asked: int, epoch: int = 0) -> PendingFetch:
    done: Future = Future()
    done.set_result(FetchResult(blocks, [], 0.0))  # type: ignore[arg-type]
    return PendingFetch(done, first, asked, epoch)


def _kept() -> StagedLoad:
    return StagedLoad(first=5, num_blocks=2, epoch=0, blocks=["b5", "b6"])  # type: ignore[list-item]


def test_a_whole_head_is_followed_by_the_kept_blocks():
    staged = _loads(_kept())._from_fetch("seq", _fetch(2, ["b2", "b3", "b4"], 3))
    assert (staged.first, staged.blocks, staged.num_blocks) == (2, ["b2", "b3", "b4", "b5", "b6"], 5)


def test_a_short_head_is_loaded_alone():
    loads = _loads(_kept())
    staged = loads._from_fetch("seq", _fetch(2, ["b2", "b3"], 3))  # b4 missing: b5 must not land at index 4
    assert (staged.first, staged.blocks) == (2, ["b2", "b3"])
    assert "seq" not in loads._kept  # the kept blocks are dropped, not joined later


def test_blocks_kept_before_a_reset_never_join():
    staged = _loads(_kept())._from_fetch("seq", _fetch(2, ["b2", "b3", "b4"], 3, epoch=1))
    assert (staged.blocks, staged.num_blocks) == (["b2", "b3", "b4"], 3)


def test_an_engine_whose_reread_head_comes_back_short_gives_stock_tokens(model, tmp_path):
    """End to end: a request's local hit is blocks 0-2 and its read of blocks 3-5 waits (a gated directory); another
    request evicts blocks 0-2 meanwhile, and block 1's blob is gone before the head is read again. Only block 0
    comes back: it loads alone, blocks 1-5 are recomputed (written at table positions 1-3, the kept blocks 3-5 would
    be K/V of other positions: other tokens)."""
    gate = threading.Event()
    gate.set()

    class GatedStore(DirectoryStore):
        def get(self, key):
            assert gate.wait(30), "the gate never opened"
            return super().get(key)

    store = GatedStore(tmp_path, 1 << 30)
    engine = Engine(model, PagedConfig(block_size=BS, num_blocks=10), kv_store=store)  # every block saved as computed
    connector = engine.scheduler.kv_transfer
    connector.cost = TransferCostModel(bandwidth_prior=1e12, prefill_prior=1.0, learn=False)  # loading always wins
    prompt = ragged_prompts([6 * BS + 1], seed=51)[0]
    run(engine, [prompt], max_new=1)
    run(engine, ragged_prompts([7 * BS - 1], seed=52), max_new=1)  # evicts the prompt's blocks 3-5 (leaves first)
    radix = engine.kv.prefix_cache
    assert radix.peek(prompt[: 6 * BS]) == 3 * BS
    gate.clear()  # the read of blocks 3-5, started as the request arrives, waits
    ids = [engine.add_request(prompt, SamplingParams(max_new_tokens=6)),
           engine.add_request(ragged_prompts([30], seed=53)[0], SamplingParams(max_new_tokens=2))]
    engine.step()  # the second request is admitted and evicts blocks 0-2
    assert radix.peek(prompt[: 6 * BS]) == 0 and connector.num_fetching == 1
    store.delete(connector._keys(radix.digests(prompt[: 6 * BS]))[1])
    gate.set()
    outs = step_all(engine, ids, [])
    assert outs[0] == stock_greedy(model, [prompt], 6)[0]
    stats = transfer_stats(engine)
    assert (stats["reread_loads"], stats["loaded_blocks"], stats["load_failures"]) == (1, 1, 1)
