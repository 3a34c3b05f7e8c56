"""`output_hidden_states=True` / `output_attentions=True`: the engine computes neither, so `generate` runs stock's
(a `PagedFallbackWarning` naming them) and returns stock's tensors, never a result whose `hidden_states` /
`attentions` are silently None. Asked as keywords or in a `GenerationConfig` (the keywords reach the check as model
inputs, the config's fields as generation options: two ways to miss it)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GenerationConfig

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning
from tests.tiny_models import tiny_model


@pytest.mark.parametrize("in_config", [True], ids=["generation_config"])
@pytest.mark.parametrize("flag,field", [("output_hidden_states", "hidden_states"), ("output_attentions", "attentions")])
def test_asking_for_hidden_states_or_attentions_runs_stock_with_a_warning(flag, field, in_config):
    stock = tiny_model("llama")
    stock.config._attn_implementation = "eager"  # (sdpa returns no attention weights)
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    ids = torch.tensor([[5, 6, 7, 8]])
    kwargs = {"max_new_tokens": 3, "do_sample": False, "return_dict_in_generate": True, flag: True}
    if in_config:
        kwargs = {"generation_config": GenerationConfig(**kwargs)}
    try:
        expected = stock.generate(ids, **kwargs)
        with pytest.warns(PagedFallbackWarning, match=flag):
            got = wrapped.generate(ids, **kwargs)
        assert torch.equal(got.sequences, expected.sequences)
        assert getattr(got, field) is not None and len(getattr(got, field)) == len(getattr(expected, field)) == 3
    finally:
        hf_paged.unwrap(wrapped)
