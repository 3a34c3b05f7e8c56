"""The master test: greedy output of a wrapped model is token-identical to stock generate (fp32, sdpa)."""

import pytest
import torch
from transformers import GenerationConfig

import hf_paged
from hf_paged import PagedCache, PagedConfig
from tests.tiny_models import FAMILIES, left_pad, ragged_prompts, stock_greedy, tiny_model

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


def test_decodes_sharing_cached_blocks_match_stock(family_model):
    """Rows whose leading blocks are the same cached blocks decode together (the cascade: the shared part read
    once); a soft-capped model (gemma2) attends them as one softmax like any other (it read only the rows' own
    blocks before)."""
    family, model, *_ = family_model
    prefix = ragged_prompts([40], seed=5)[0]
    prompts = [prefix + tail for tail in ragged_prompts([3, 9, 14], seed=6)]
    want = stock_greedy(model, prompts, 12)
    hf_paged.wrap(model, block_size=4)
    try:
        model.generate_batch([prefix], GenerationConfig(max_new_tokens=1))  # the prefix, cached
        outs = model.generate_batch(prompts, GenerationConfig(max_new_tokens=12))
        assert hf_paged.engine_of(model).stats()["prompt_tokens_cached"] >= 3 * 40
    finally:
        hf_paged.unwrap(model)
    assert [out.generated_tokens for out in outs.values()] == want, family


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


def test_long_rope_sequences_past_the_short_window_run_on_stock():
    """Phi-3's LongRoPE rotates every position with its long factors once a sequence passes
    `original_max_position_embeddings`, and stock generate recomputes the whole sequence there: kept blocks (and
    chunked prefill) had keys of the short factors, and the tokens differed. The engine serves sequences up to that
    length; `generate` runs longer ones on stock (a fallback warning), `generate_batch` stops them there."""
    from transformers import GenerationConfig, Phi3Config, Phi3ForCausalLM

    torch.manual_seed(0)
    config = Phi3Config(vocab_size=97, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, num_key_value_heads=2, original_max_position_embeddings=16,
                        max_position_embeddings=64, pad_token_id=0, eos_token_id=1, bos_token_id=2,
                        rope_scaling={"type": "longrope", "short_factor": [1.0] * 8,
                                      "long_factor": [2.0 + i for i in range(8)]})
    model = Phi3ForCausalLM(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)  # (random weights this size barely depend on positions otherwise)
    prompts = {n: torch.randint(3, 97, (1, n), generator=torch.Generator().manual_seed(n)) for n in (5, 14, 40)}
    expected = {n: model.generate(ids, max_new_tokens=8, do_sample=False) for n, ids in prompts.items()}
    hf_paged.wrap(model, max_num_batched_tokens=7)
    try:
        assert torch.equal(model.generate(prompts[5], max_new_tokens=8, do_sample=False), expected[5])  # engine
        for n in (14, 40):
            with pytest.warns(hf_paged.PagedFallbackWarning, match="LongRoPE"):
                assert torch.equal(model.generate(prompts[n], max_new_tokens=8, do_sample=False), expected[n])
        (out,) = model.generate_batch([prompts[14][0].tolist()], GenerationConfig(max_new_tokens=8)).values()
        assert len(out.generated_tokens) == 2 and out.finish_reason == "length"
    finally:
        hf_paged.unwrap(model)
