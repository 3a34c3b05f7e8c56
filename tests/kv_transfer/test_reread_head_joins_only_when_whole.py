"""A load whose head was evicted while its read waited reads the head again (`_reask`); the blocks kept from the
first read join the new head only when the head came back whole. A short head (a blob missing or refused) followed by
the kept blocks would put those blocks at the wrong table positions: K/V served under another prefix.
h89's mutation audit: the join's check replaced by True survived every test (no test reached a short re-read)."""

from __future__ import annotations

from concurrent.futures import Future
from types import SimpleNamespace

from hf_paged.kv_transfer.fetcher import FetchResult, PendingFetch
from hf_paged.kv_transfer.paced_load import PacedLoads, StagedLoad


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
