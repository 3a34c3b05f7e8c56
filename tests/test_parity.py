"""The master test: greedy output of a wrapped model is token-identical to stock generate (fp32, sdpa)."""

import pytest
import torch

import hf_paged
from hf_paged import PagedCache, PagedConfig
from tests.tiny_models import FAMILIES, left_pad, ragged_prompts, tiny_model

LENGTHS = [3, 17, 33, 50, 8, 70]  # ragged: left padding up to 70; with 40 new tokens contexts cross 64
MAX_NEW = 40


@pytest.fixture(scope="module", params=sorted(FAMILIES))
def family_model(request):
    model = tiny_model(request.param)
    ids, mask = left_pad(ragged_prompts(LENGTHS))
    stock = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
    return request.param, model, ids, mask, stock


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_wrapped_generate_matches_stock(family_model, block_size):
    family, model, ids, mask, stock = family_model
    hf_paged.wrap(model, block_size=block_size, max_num_batched_tokens=64)
    try:
        out = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False)
        engine = hf_paged.engine_of(model)
        engine.check_integrity()
        assert engine.stats()["steps"] > MAX_NEW  # budget 64 forced chunked prefill of the 150-token batch
    finally:
        hf_paged.unwrap(model)
    assert out.shape == stock.shape
    assert torch.equal(out, stock), f"{family}, block_size {block_size}"


@pytest.mark.parametrize("block_size", [1, 16, 64])
def test_paged_cache_as_stock_cache_argument(family_model, block_size):
    family, model, ids, mask, stock = family_model
    cache = PagedCache(model.config, PagedConfig(block_size=block_size, num_blocks=4096 // block_size * 4))
    out = model.generate(ids, attention_mask=mask, max_new_tokens=MAX_NEW, do_sample=False, cache=cache)
    assert torch.equal(out, stock), f"{family}, block_size {block_size}"
    cache.check_integrity()
    stats = cache.stats()
    assert stats["live_sequences"] == len(LENGTHS)
    assert stats["unused_slots"] < block_size * len(LENGTHS)  # at most one partial block per sequence
