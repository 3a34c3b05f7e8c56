"""Observability checked against counts made by hand: `Engine.stats()` (h75's hostile pass on the numbers
operators alert and bill on)."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def test_prefix_hit_rate_counts_a_request_with_n_forks_once(model):
    """The hit rate is served / looked-up prompt tokens, as /metrics' prefix_cache_hit_rate: a request of n=4
    on a cached 64-token prompt looks it up once (its forks share the parent's blocks) and is served 63 of 64
    tokens; the ratio divided by `prompt_tokens` (which counts every fork) read 63 / 320 instead of 63 / 128."""
    engine = Engine(model, PagedConfig(block_size=16, num_blocks=64))
    prompt = list(range(3, 67))
    engine.run([engine.add_request(prompt, SamplingParams(max_new_tokens=2))])  # warms the cache
    rid = engine.add_request(prompt, SamplingParams(max_new_tokens=2, num_return_sequences=4, do_sample=True, seed=1))
    served = engine.run([rid])[rid].num_cached_tokens
    stats = engine.stats()
    assert stats["prompt_tokens"] == 64 + 4 * 64  # submitted: every fork's prompt
    assert stats["prompt_tokens_queried"] == 2 * 64 and stats["prompt_tokens_cached"] == served == 63
    assert stats["prefix_hit_rate"] == pytest.approx(63 / 128)


def test_requests_swapped_counts_the_preempted_requests_whose_kv_is_in_cpu_memory(model):
    """preemption_mode='swap': each step, `requests_swapped` is the number of waiting requests holding a swapped
    copy (vLLM v0's num_requests_swapped), and it returns to 0."""
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=12, max_num_seqs=4, preemption_mode="swap"))
    ids = [engine.add_request(list(range(5 + i, 17 + i)), SamplingParams(max_new_tokens=16)) for i in range(4)]
    seen = 0
    while engine.has_unfinished:
        engine.step()
        swapped = sum(not r.ended and r.swapped is not None for r in engine.requests.values())
        assert engine.stats()["requests_swapped"] == swapped
        seen = max(seen, swapped)
    engine.run(ids)
    assert seen > 0 and engine.stats()["preemptions"] > 0 and engine.stats()["requests_swapped"] == 0


def test_scheduled_time_marks_the_end_of_a_request_s_wait_in_the_queue(model):
    """One sequence at a time: the second request is admitted after the first finished, so its queue time
    (scheduled - created) covers the first's whole run; each output orders created <= scheduled <= first token."""
    engine = Engine(model, PagedConfig(block_size=16, num_blocks=64, max_num_seqs=1))
    ids = [engine.add_request(list(range(3, 20)), SamplingParams(max_new_tokens=5)) for _ in range(2)]
    outputs = engine.run(ids)
    first, second = outputs[ids[0]], outputs[ids[1]]
    for out in (first, second):
        assert out.created_time <= out.scheduled_time <= out.lifespan[0] <= out.lifespan[1]
    assert second.scheduled_time >= first.lifespan[1]  # it waited for the whole of the first request


def test_a_fork_is_scheduled_when_its_parent_has_sampled_its_first_token(model):
    """A fork of n=2 starts on its parent's blocks in the step of the parent's first token: its scheduled_time
    is then (not -1, nor a later re-admission), so created -> scheduled is its wait for the parent's prefill."""
    engine = Engine(model, PagedConfig(block_size=16, num_blocks=64))
    rid = engine.add_request(list(range(3, 40)), SamplingParams(max_new_tokens=3, num_return_sequences=2,
                                                                do_sample=True, seed=5))
    fork = next(r for r in engine.requests if r != rid)
    outputs = engine.run([rid, fork])
    parent, child = outputs[rid], outputs[fork]
    assert parent.created_time <= parent.scheduled_time < child.scheduled_time <= child.lifespan[0]  # same step
    # as the parent's first token (`now` of that step is read after the fork starts)
