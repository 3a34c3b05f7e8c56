"""PyramidKV's per-layer hidden blocks live with the block table they index (`KVCacheManager`): copied to a request's
forks, carried through a swap, gone when the table is freed. They lived in a dict of the pruner's keyed by request
id that nothing ever emptied: a server kept one entry for every request it had ever pruned (found by h96)."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, tiny_model

PYRAMID = {"block_size": 4, "kv_pruning": "pyramidkv", "kv_keep_ratio": 0.3, "num_sink_tokens": 4, "window_tokens": 8,
           "enable_prefix_caching": False}


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _run(model, prompts, max_new=8, n=1, **config):
    engine = Engine(model, PagedConfig(**(PYRAMID | config)))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=max_new, num_return_sequences=n)) for p in prompts]
    hid = 0
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
        hid = max(hid, sum(engine.kv.hidden_blocks(s) is not None for s in engine.kv.seqs))
    outs = {i: engine.pop_output(i) for i in ids + [f"{i}__child#{c}" for i in ids for c in range(n - 1)]}
    assert all(o.error is None for o in outs.values())
    return engine, {i: o.generated_tokens for i, o in outs.items()}, hid


def test_nothing_is_kept_for_finished_requests(model):
    engine, _, hid = _run(model, ragged_prompts([60, 50, 70], seed=1), max_new=3)
    assert hid >= 1  # the premise: tables had hidden blocks while their requests ran
    assert not engine.kv.seqs and not engine.pruner.pending and not vars(engine.pruner).get("hidden")


def test_forks_see_what_their_parent_sees(model):
    prompt = ragged_prompts([70], seed=3)
    _, alone, _ = _run(model, prompt)
    _, forked, hid = _run(model, prompt, n=3)
    assert hid >= 3 and set(map(tuple, forked.values())) == {tuple(next(iter(alone.values())))}


def test_a_swapped_request_keeps_its_hidden_blocks(model):
    prompts = ragged_prompts([66, 58, 71, 62], seed=4)
    _, alone, _ = _run(model, prompts, max_new=16)
    engine, swapped, _ = _run(model, prompts, max_new=16, num_blocks=44, preemption_mode="swap")
    assert engine.scheduler.num_preemptions > 0  # the premise: requests were swapped out and back
    assert list(swapped.values()) == list(alone.values())
