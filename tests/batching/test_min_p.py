"""`SamplingParams.min_p`: tokens less likely than min_p times the most likely one are dropped, after temperature and
before top-k/top-p (vLLM's order), on both sampled paths (a seeded row alone; unseeded rows drawn together)."""

from __future__ import annotations

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.batching.sampler import _warp
from hf_paged.errors import InvalidConfigError
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


def vllm_order(row: torch.Tensor, temperature: float, min_p: float, top_k: int, top_p: float) -> torch.Tensor:
    """vLLM's sampler, written out: temperature, min-p on the tempered probabilities, then top-k and top-p."""
    logits = row / temperature
    probs = torch.softmax(logits, dim=-1)
    logits = logits.masked_fill(probs < min_p * probs.max(dim=-1, keepdim=True).values, float("-inf"))
    kth = logits.topk(top_k, dim=-1).values[..., -1:]
    logits = logits.masked_fill(logits < kth, float("-inf"))
    order = logits.sort(dim=-1, descending=True)
    cumulative = torch.softmax(order.values, dim=-1).cumsum(dim=-1)
    drop = (cumulative - torch.softmax(order.values, dim=-1)) > top_p  # keep through the token that crosses top_p
    return logits.scatter(-1, order.indices, order.values.masked_fill(drop, float("-inf")))


def test_min_p_follows_temperature_and_precedes_top_k_and_top_p():
    torch.manual_seed(0)
    rows = torch.randn(64, 50) * 3
    for temperature, min_p, top_k, top_p in ((0.7, 0.05, 8, 0.9), (1.6, 0.2, 30, 0.95), (0.5, 0.01, 3, 1.0)):
        params = SamplingParams(do_sample=True, temperature=temperature, min_p=min_p, top_k=top_k, top_p=top_p)
        got = _warp(params, None, rows.clone())
        expected = vllm_order(rows, temperature, min_p, top_k, top_p)
        assert torch.equal(torch.isinf(got), torch.isinf(expected))  # the same tokens kept
        kept = ~torch.isinf(expected)
        torch.testing.assert_close(got[kept], expected[kept])
    # the order matters: at temperature 2 min-p keeps more than min-p on the raw logits would
    wide = SamplingParams(do_sample=True, temperature=2.0, min_p=0.1)
    raw_then_tempered = SamplingParams(do_sample=True, min_p=0.1)
    assert torch.isinf(_warp(wide, None, rows.clone())).sum() < torch.isinf(_warp(raw_then_tempered, None,
                                                                                  rows.clone())).sum()


@pytest.mark.parametrize("seed", [None, 7])  # unseeded rows are drawn together; a seeded one alone
def test_min_p_of_one_keeps_the_argmax_alone(seed):
    model = tiny_model("llama")
    prompts = ragged_prompts([6, 21, 13], seed=5)
    expected = stock_greedy(model, prompts, 12)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=64))
    params = SamplingParams(max_new_tokens=12, do_sample=True, temperature=1.5, min_p=1.0, seed=seed)
    ids = [engine.add_request(p, params) for p in prompts]
    outs = engine.run(ids)
    assert [outs[i].generated_tokens for i in ids] == expected


@pytest.mark.parametrize("kwargs", [{"min_p": 1.5}, {"min_p": -0.1}, {"min_p": True}, {"min_p": float("nan")},
                                    {"min_p": 0.1, "do_sample": True, "constraint_mode": "resample"}])
def test_bad_min_p_is_refused(kwargs):
    with pytest.raises(InvalidConfigError, match="min_p"):
        SamplingParams(**kwargs)
