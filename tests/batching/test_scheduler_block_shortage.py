"""Scheduler promises when blocks run short, on hand-set state (no model): a swapped-out request whose K/V does not
fit back blocks admission (FCFS: a smaller request behind it does not take the blocks it waits for), and a decode's
speculative drafts are dropped, never paid for by preempting another request, when their blocks are not free."""

from __future__ import annotations

from types import SimpleNamespace

from hf_paged import PagedConfig, SamplingParams
from hf_paged.batching.request import Request, RequestStatus
from hf_paged.batching.scheduler import Scheduler
from hf_paged.batching.swap import SwappedKV, swap_in
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import KVCacheManager

BLOCK = 4


def scheduler(num_blocks: int, **config) -> Scheduler:
    kv = KVCacheManager(BlockPool(num_blocks), BLOCK)
    cache = SimpleNamespace(manager=kv, block_size=BLOCK, load_blocks=lambda block_ids, layers: None)
    cfg = PagedConfig(block_size=BLOCK, num_blocks=num_blocks, max_num_batched_tokens=64,
                      enable_prefix_caching=False, **config)
    return Scheduler(cfg, kv, on_resume=lambda r: swap_in(cache, r))  # the engine's swap-in, on a stub cache


def running(sched: Scheduler, rid: str, arrival: int, num_prompt: int, drafts=()) -> Request:
    """A request decoding: its prompt and one generated token, every token but the last computed and in blocks."""
    r = Request(rid, list(range(1, num_prompt + 1)), SamplingParams(max_new_tokens=32), arrival_index=arrival,
                output_ids=[7], status=RequestStatus.RUNNING, num_computed_tokens=num_prompt, draft_ids=list(drafts))
    sched.requests[rid] = r
    sched.kv.add_sequence(rid)
    assert sched.kv.allocate_slots(rid, num_prompt)
    sched.running.append(r)
    return r


def test_a_swapped_request_that_does_not_fit_back_blocks_the_smaller_ones_behind_it():
    sched = scheduler(8)
    running(sched, "r", 0, 20)  # 5 blocks; its decode takes a sixth: 2 left
    swapped = Request("s", list(range(1, 21)), SamplingParams(max_new_tokens=32), arrival_index=1, output_ids=[7],
                      status=RequestStatus.PREEMPTED, num_preemptions=1, num_computed_tokens=20,
                      swapped=SwappedKV(20, 0, []))  # its 20 tokens need 5 blocks back
    small = Request("b", [1, 2, 3], SamplingParams(max_new_tokens=4), arrival_index=2)  # 1 block would do
    sched.add(swapped)
    sched.add(small)
    out = sched.schedule()
    assert [(s.request.request_id, s.num_tokens) for s in out.scheduled] == [("r", 1)]
    assert out.blocked is swapped and not out.preempted
    assert [item[1].request_id for item in sched.waiting] == ["s", "b"]
    assert "s" not in sched.kv and "b" not in sched.kv and swapped.swapped is not None  # nothing half-taken
    sched.remove(sched.running[0])  # blocks free up: the swapped request resumes first, then the small one
    out = sched.schedule()
    assert [(s.request.request_id, s.num_tokens) for s in out.scheduled] == [("s", 1), ("b", 3)]
    assert swapped.swapped is None and swapped.num_computed_tokens == 20


def test_drafts_whose_blocks_are_not_free_are_dropped_without_preempting():
    sched = scheduler(4)
    first = running(sched, "a", 0, 6, drafts=[3, 4, 5, 6, 7])  # 2 blocks; with its drafts it would need a third
    second = running(sched, "b", 1, 6)  # 2 blocks: the pool is full
    out = sched.schedule()
    assert not out.preempted and second.status is RequestStatus.RUNNING
    assert [(s.request.request_id, s.num_tokens, s.num_draft_tokens) for s in out.scheduled] == [
        ("a", 1, 0), ("b", 1, 0)]
    assert first.draft_ids == []


def test_drafts_whose_blocks_are_free_run_with_the_decode():
    sched = scheduler(5)  # one block free: room for the drafts
    first = running(sched, "a", 0, 6, drafts=[3, 4, 5, 6, 7])
    running(sched, "b", 1, 6)
    out = sched.schedule()
    assert not out.preempted
    assert [(s.request.request_id, s.num_tokens, s.num_draft_tokens) for s in out.scheduled] == [
        ("a", 6, 5), ("b", 1, 0)]
    assert first.draft_ids == [3, 4, 5, 6, 7]
