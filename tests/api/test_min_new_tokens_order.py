"""`min_new_tokens` holds EOS back where stock's processor list does: before the warpers. Masked after them (as the
h55 pass found), a top-k / top-p / min-p that kept EOS kept one token fewer: with EOS the most likely token and
top_k=2, every draw was the one other token, where stock draws from two."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

import hf_paged

PROMPT = torch.tensor([[5, 17, 33, 9, 41, 12]])


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)
    stock = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        logits = stock(PROMPT).logits[0, -1]
    eos = int(logits.argmax())  # EOS is the most likely next token: top-k keeps it
    stock.generation_config.eos_token_id = eos
    stock.generation_config.pad_token_id = eos
    return stock, hf_paged.wrap(copy.deepcopy(stock)), eos, logits


@pytest.mark.parametrize("warper", [{"top_k": 2}, {"top_p": 0.6}, {"min_p": 0.3}])
def test_sampled_generate_with_min_new_tokens_equals_stock(models, warper):
    stock, wrapped, eos, _ = models
    kwargs = {"do_sample": True, "min_new_tokens": 1, "max_new_tokens": 2, "num_return_sequences": 48, **warper}
    torch.manual_seed(7)
    want = stock.generate(PROMPT, **kwargs)
    torch.manual_seed(7)
    got = wrapped.generate(PROMPT, **kwargs)
    assert torch.equal(got, want)
    assert eos not in got[:, PROMPT.shape[1]].tolist()


def test_generate_batch_draws_from_the_tokens_stock_keeps(models):
    _, wrapped, eos, logits = models
    masked = logits.clone()
    masked[eos] = float("-inf")
    support = set(masked.topk(2).indices.tolist())  # stock: EOS out first, then the two most likely others
    config = GenerationConfig(do_sample=True, top_k=2, min_new_tokens=1, max_new_tokens=1, eos_token_id=eos,
                              pad_token_id=eos)
    outs = wrapped.generate_batch([PROMPT[0].tolist()] * 64, config)
    drawn = {out.generated_tokens[0] for out in outs.values()}
    assert drawn == support
