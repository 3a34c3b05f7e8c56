"""Aborting `n` forks: a fork aborted while it waits for its parent's first token ends once and never runs, and
every request added ends counted exactly once (added = finished + aborted + failed)."""

import pytest

from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.batching.request import fork_ids
from tests.tiny_models import tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _drain(engine: Engine) -> list:
    ended = engine.take_ended()  # (aborts between steps)
    while engine.has_unfinished:
        ended += engine.step().finished
    return ended + engine.take_ended()


def _counts(engine: Engine) -> tuple[int, int, int, int]:
    stats = engine.stats()
    return stats["requests_added"], stats["requests_finished"], stats["requests_aborted"], stats["requests_failed"]


def test_a_waiting_fork_aborted_alone_never_runs(model):
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64))
    rid = engine.add_request(list(range(3, 20)), SamplingParams(max_new_tokens=5, num_return_sequences=3,
                                                                do_sample=False))
    parent, first, second = fork_ids(rid, 3)
    engine.abort(first)  # before any step: it waits for the parent's first token
    ended = _drain(engine)
    by_id = {}
    for output in ended:
        assert output.request_id not in by_id, f"{output.request_id} ended twice"
        by_id[output.request_id] = output
    assert by_id[first].status is RequestStatus.FAILED and by_id[first].finish_reason == "abort"
    assert by_id[first].generated_tokens == []
    assert by_id[parent].finish_reason == by_id[second].finish_reason == "length"
    assert by_id[parent].generated_tokens == by_id[second].generated_tokens  # greedy forks agree
    assert _counts(engine) == (3, 2, 1, 0)
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0


@pytest.mark.parametrize("order", ["parent_first", "forks_first"])
@pytest.mark.parametrize("steps", [0, 1, 3])
def test_abort_counts_each_request_once(model, order, steps):
    """An aborted request and its forks count n aborts, whatever the order of the ids aborted (a server aborts
    every id it still waits for, in no set order) and whether the forks run yet."""
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=64, max_num_batched_tokens=8))
    rid = engine.add_request(list(range(3, 30)), SamplingParams(max_new_tokens=20, num_return_sequences=3,
                                                                do_sample=False))
    for _ in range(steps):  # 0: all wait; 1: the parent prefills (chunked); 3: the forks run on their own
        engine.step()
    ids = fork_ids(rid, 3)
    for request_id in (ids if order == "parent_first" else ids[::-1]):
        engine.abort(request_id)
    ended = _drain(engine)
    assert sorted(o.request_id for o in ended) == sorted(ids)
    assert all(o.finish_reason == "abort" for o in ended)
    assert _counts(engine) == (3, 0, 3, 0)
    engine.check_integrity()
    assert engine.cache.pool.num_used_blocks == 0
