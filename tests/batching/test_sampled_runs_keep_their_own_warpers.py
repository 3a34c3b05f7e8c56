"""Unseeded sampled rows are warped in runs of rows with the same warpers (`Sampler._draw_together`): a row whose
temperature, top_k or top_p differs from its neighbour's starts a new run, so it is warped with its own settings.
A near-zero top_p keeps the argmax alone (as stock's `TopPLogitsWarper`): such a request samples its greedy tokens
whatever the request before it in the step asks."""

from __future__ import annotations

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


@pytest.mark.parametrize("other", [{"top_p": 1.0}, {"top_k": 50}, {"temperature": 1.5}],
                         ids=["top_p", "top_k", "temperature"])
def test_a_row_keeps_its_own_top_p_beside_a_row_with_other_warpers(model, other):
    loose, tight = ragged_prompts([7, 9], seed=8)
    torch.manual_seed(0)
    engine = Engine(model, PagedConfig(block_size=4, num_blocks=32))
    a = engine.add_request(loose, SamplingParams(max_new_tokens=8, do_sample=True, **{"top_p": 0.9, **other}))
    b = engine.add_request(tight, SamplingParams(max_new_tokens=8, do_sample=True, top_p=1e-9))
    outs = engine.run([a, b])
    assert outs[b].generated_tokens == stock_greedy(model, [tight], 8)[0]
    engine.check_integrity()
