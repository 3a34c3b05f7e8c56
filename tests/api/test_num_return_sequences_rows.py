"""`num_return_sequences=n` of several prompts: stock's row order, each prompt's n rows next to each other
(`[p0, p0, p1, p1]`), every row's prompt part the prompt its tokens continue. Sampling with `top_k=1` is
deterministic, so the rows equal stock's token for token."""

from __future__ import annotations

import copy
import warnings

import torch

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning
from tests.tiny_models import tiny_model

IDS = torch.tensor([[5, 6, 7, 8, 9], [40, 41, 42, 43, 44], [70, 12, 33, 9, 3]])


def test_each_prompts_return_sequences_are_adjacent_and_equal_stocks():
    stock = tiny_model("llama")
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    kwargs = {"max_new_tokens": 5, "do_sample": True, "top_k": 1, "num_return_sequences": 2}
    try:
        expected = stock.generate(IDS, attention_mask=torch.ones_like(IDS), **kwargs)
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)
            got = wrapped.generate(IDS, attention_mask=torch.ones_like(IDS), **kwargs)
        assert got[:, :5].tolist() == IDS.repeat_interleave(2, dim=0).tolist()
        assert got.tolist() == expected.tolist()
    finally:
        hf_paged.unwrap(wrapped)
