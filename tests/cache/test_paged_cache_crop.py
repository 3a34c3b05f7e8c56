"""`PagedCache.crop` on the stock `cache=` path behaves like transformers' `DynamicCache.crop`: it keeps the first
`max_length` tokens (a negative value drops that many from the end, 0 drops everything), a partial last block
included, and a forward of the dropped tokens afterwards gives the logits of an uncropped run."""

from __future__ import annotations

import pytest
import torch

from hf_paged import PagedConfig
from hf_paged.cache.paged_cache import PagedCache
from tests.tiny_models import ragged_prompts, tiny_model

BLOCK_SIZE = 4


@pytest.fixture(scope="module")
def model():
    return tiny_model("llama")


def _logits(model, ids, cache=None):
    with torch.no_grad():
        return model(input_ids=ids, cache=cache, use_cache=cache is not None).logits


@pytest.mark.parametrize("max_length, kept", [(6, 6), (8, 8), (-3, 7), (0, 0), (10, 10), (12, 10)])
def test_crop_keeps_the_first_tokens_and_a_resumed_forward_matches_an_uncropped_one(model, max_length, kept):
    ids = torch.tensor([ragged_prompts([10], seed=3)[0]])
    full = _logits(model, ids)  # no cache: the reference
    cache = PagedCache(model.config, PagedConfig(block_size=BLOCK_SIZE, num_blocks=16))
    _logits(model, ids, cache)
    cache.crop(max_length)
    assert cache.get_seq_length() == kept
    table = cache.manager.block_ids(0)
    assert len(table) == -(-kept // BLOCK_SIZE), "a crop keeps exactly the blocks of the tokens it keeps"
    assert cache.manager.num_tokens(0) == kept
    cache.check_integrity()
    assert cache.stats()["blocks_used"] == len(table)
    if kept < 10:  # the dropped tokens again, on top of what was kept
        resumed = _logits(model, ids[:, kept:], cache)
        torch.testing.assert_close(resumed, full[:, kept:], rtol=1e-5, atol=1e-5)
        assert cache.get_seq_length() == 10
        cache.check_integrity()
