"""`past_key_values` in `return_dict_in_generate=True` outputs. Decided: the engine returns None there (the KV lives
in its pool, shared between requests and freed or evicted as the pool needs; copying it into a `DynamicCache` would
cost a copy of every layer's KV per call that nobody asked for), and a chat loop that hands
`out.past_key_values` back gets the same tokens as stock's cached continuation, with the earlier turn's blocks
served from the prefix cache (counted work, not recomputed). A stock cache passed in runs stock generate, saying so."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import DynamicCache

import hf_paged
from hf_paged import PagedConfig
from hf_paged.api.generate import PagedFallbackWarning
from tests.tiny_models import ragged_prompts, tiny_model

KWARGS = {"do_sample": False, "max_new_tokens": 6, "return_dict_in_generate": True}


def test_a_chat_loop_continuing_from_out_past_key_values_equals_stock():
    first, second = (torch.tensor([p]) for p in ragged_prompts([9, 5], seed=4))
    stock_model = tiny_model("llama")
    stock = stock_model.generate(first, **KWARGS)
    assert isinstance(stock.past_key_values, DynamicCache)
    stock_next = stock_model.generate(torch.cat([stock.sequences, second], 1), past_key_values=stock.past_key_values,
                                      **KWARGS)
    model = hf_paged.wrap(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=64))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)  # (no fallback to stock on either turn)
            ours = model.generate(first, **KWARGS)
            assert ours.past_key_values is None and torch.equal(ours.sequences, stock.sequences)
            engine = hf_paged.engine_of(model)
            cached = engine.stats()["prompt_tokens_cached"]
            ours_next = model.generate(torch.cat([ours.sequences, second], 1), past_key_values=ours.past_key_values,
                                       **KWARGS)
        assert torch.equal(ours_next.sequences, stock_next.sequences)
        # the first turn's full blocks (its last token has no KV yet) came from the prefix cache
        assert engine.stats()["prompt_tokens_cached"] - cached >= (ours.sequences.shape[1] - 1) // 4 * 4
        with pytest.warns(PagedFallbackWarning, match="explicit cache"):  # a stock cache: stock generate runs
            again = model.generate(torch.cat([stock.sequences, second], 1),
                                   past_key_values=stock_model.generate(first, **KWARGS).past_key_values, **KWARGS)
        assert torch.equal(again.sequences, stock_next.sequences)
    finally:
        hf_paged.unwrap(model)
