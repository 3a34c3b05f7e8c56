"""A request running alone whose next tokens the whole pool cannot hold ends FAILED (`OutOfBlocksError`) instead of
preempting itself. Under SnapKV / PyramidKV a self-preempted request was re-admitted at once (its recompute stops at
the prompt's end, which fits), grew back to the same point and preempted itself again, for ever (h7 F0: 987
preemptions in 2,000 steps, never ending)."""

from __future__ import annotations

import pytest

import hf_paged
from hf_paged import PagedConfig, SamplingParams
from hf_paged.errors import OutOfBlocksError
from tests.tiny_models import ragged_prompts, tiny_model

TIGHT = {"num_blocks": 6, "block_size": 8}
PRUNED = {"num_sink_tokens": 4, "window_tokens": 8}


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _run(model, prompts, **config):
    engine = hf_paged.Engine(model, PagedConfig(**(TIGHT | config)))
    ids = [engine.add_request(p, SamplingParams(max_new_tokens=30)) for p in prompts]
    for _ in range(400):  # (each ends within ~100 steps)
        if not engine.has_unfinished:
            break
        engine.step()
        engine.check_integrity()
    assert not engine.has_unfinished, f"still running after 400 steps ({engine.stats()['preemptions']} preemptions)"
    return [engine.pop_output(i) for i in ids]


@pytest.mark.parametrize("policy", ["snapkv", "pyramidkv"])
@pytest.mark.parametrize("mode", ["recompute", "swap"])
@pytest.mark.parametrize("sizes", [[30], [30, 25, 40]])
def test_a_pruned_request_that_outgrows_the_pool_ends(model, policy, mode, sizes):
    outputs = _run(model, ragged_prompts(sizes, seed=81), kv_pruning=policy, kv_keep_ratio=0.3,
                   preemption_mode=mode, **PRUNED)
    for output in outputs:
        assert output.finish_reason in ("length", "error")
        if output.finish_reason == "error":
            assert output.error_type is OutOfBlocksError or output.error_type == "OutOfBlocksError"
    assert any(o.finish_reason == "error" for o in outputs)  # the premise: one outgrows 6 blocks of 8


def test_a_plain_request_that_outgrows_the_pool_fails_without_preempting(model):
    (output,) = _run(model, ragged_prompts([30], seed=81))
    assert output.finish_reason == "error" and "can ever free" in str(output.error)
