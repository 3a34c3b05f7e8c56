"""The scheduler's promises, step by step, under a pool too small for every request (preemption, blocked admission):
the victim is the latest arrival of the lowest priority, no step runs more than
`max_num_seqs` requests, and admission is FCFS (nothing behind a waiting request whose blocks do not fit overtakes it).
Each test also checks the tokens against stock greedy and the engine's integrity; `num_cached_tokens` counts the
first admission only; without chunked prefill a prompt is never split."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _record(engine):
    """Spy on `Scheduler.schedule`: per step, the running and waiting requests before it and what it decided."""
    steps = []
    scheduler = engine.scheduler
    schedule = scheduler.schedule

    def spy():
        running = list(scheduler.running)
        waiting = [item[1] for item in scheduler.waiting]
        out = schedule()
        steps.append({"running": running, "waiting": waiting, "out": out})
        return out

    scheduler.schedule = spy
    return steps


def test_the_victim_is_the_latest_arrival_not_yet_scheduled(model):
    """Each request that cannot get its blocks preempts the lowest-priority, latest-arriving running request that
    the step has not scheduled (possibly itself), in turn, until its blocks fit."""
    calls = []
    def spy_engine(engine):
        scheduler = engine.scheduler
        allocate_or_preempt = scheduler._allocate_or_preempt

        def spy(request, num_tokens, scheduled_ids, out):
            candidates = [r for r in scheduler.running if r.request_id not in scheduled_ids]
            before = len(out.preempted)
            ok = allocate_or_preempt(request, num_tokens, scheduled_ids, out)
            calls.append((candidates, out.preempted[before:]))
            return ok

        scheduler._allocate_or_preempt = spy

    prompts = ragged_prompts([20, 25, 18, 22, 9, 13], seed=5)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=14, max_num_batched_tokens=32,
                                       enable_prefix_caching=False))
    spy_engine(engine)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=24)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == stock_greedy(model, prompts, 24)
    engine.check_integrity()
    victims = [(c, v) for c, v in calls if v]
    assert victims, "the pool was meant to force preemptions"
    for candidates, preempted in victims:
        latest_first = sorted(candidates, key=lambda r: (r.priority, -r.arrival_index))
        assert [r.request_id for r in preempted] == [r.request_id for r in latest_first[: len(preempted)]]


@pytest.mark.parametrize("max_num_seqs", [1, 2, 3])
def test_no_step_runs_more_than_max_num_seqs(model, max_num_seqs):
    prompts = ragged_prompts([5, 7, 6, 9, 4], seed=2)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=64,
                                       max_num_seqs=max_num_seqs))
    steps = _record(engine)
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=6)) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == stock_greedy(model, prompts, 6)
    sizes = [len(s["out"].scheduled) for s in steps]
    assert max(sizes) == max_num_seqs  # reached (the budget and pool hold every request), never passed


def test_admission_is_fcfs_behind_a_request_whose_blocks_do_not_fit(model):
    """A long prompt waiting for blocks is not overtaken by shorter ones queued behind it (they would keep taking
    the blocks it waits for)."""
    long_, *short = ragged_prompts([60, 6, 5, 7], seed=4)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=20, max_num_batched_tokens=64,
                                       enable_prefix_caching=False))
    steps = _record(engine)
    first = engine.add_request(ragged_prompts([30], seed=9)[0], SamplingParams(max_new_tokens=10))
    engine.step()  # it holds 8 of the 20 blocks: the long prompt (15 blocks) cannot start beside it
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=4)) for p in [long_, *short]]
    outs = engine.run([first, *ids])
    blocked = [s for s in steps if s["out"].blocked is not None]
    assert blocked, "the long prompt was meant to wait for blocks"
    for s in blocked:
        head = s["out"].blocked
        waiting = {id(r) for r in s["waiting"]}
        admitted = [item.request for item in s["out"].scheduled if id(item.request) in waiting]
        assert all(r.arrival_index < head.arrival_index for r in admitted), "a later request overtook the blocked one"
    assert [outs[i].generated_tokens for i in ids] == stock_greedy(model, [long_, *short], 4)
    engine.check_integrity()


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_num_cached_tokens_counts_the_first_admission_only(model, mode):
    """`RequestOutput.num_cached_tokens` is the prompt the prefix cache served at the request's first admission: a
    preempted request that finds its own blocks cached when it comes back reports no hit it did not have (the
    prompts share nothing)."""
    prompts = ragged_prompts([20, 25, 18, 22], seed=5)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=14, max_num_batched_tokens=32,
                                       enable_prefix_caching=True, preemption_mode=mode))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=24)) for p in prompts]
    outs = engine.run(ids)
    assert engine.stats()["preemptions"] > 0
    assert [outs[i].generated_tokens for i in ids] == stock_greedy(model, prompts, 24)
    assert [outs[i].num_cached_tokens for i in ids] == [0, 0, 0, 0]
    engine.check_integrity()


def test_without_chunked_prefill_a_prompt_waits_for_a_step_that_holds_it_whole(model):
    """`enable_chunked_prefill=False`: a prompt the whole budget holds, but not what a step's decodes leave of it,
    waits for a step with room; it is never split."""
    first, second = ragged_prompts([10, 32], seed=6)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=32,
                                       enable_chunked_prefill=False))
    steps = _record(engine)
    a = engine.add_request(first, SamplingParams(max_new_tokens=6))
    engine.step()
    b = engine.add_request(second, SamplingParams(max_new_tokens=4))
    outs = engine.run([a, b])
    chunks = [item.num_tokens for s in steps for item in s["out"].scheduled if item.request.request_id == b]
    assert chunks[0] == 32, chunks
    assert [outs[a].generated_tokens, outs[b].generated_tokens] == stock_greedy(model, [first, second], 6)[:1] + \
        stock_greedy(model, [second], 4)
    engine.check_integrity()
