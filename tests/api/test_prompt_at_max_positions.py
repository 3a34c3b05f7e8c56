"""A prompt exactly `max_position_embeddings` long: its first new token comes from the last position, which stock
`generate` computes for rotary (Llama) and learned (GPT-2) positions alike. It was refused ("leaves no room to
generate"); it now gets stock's token, without a PositionLimitWarning for max_new_tokens=1, and a prompt longer than
the positions is still refused."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged import PagedConfig
from hf_paged.api.generate import PositionLimitWarning
from hf_paged.errors import PromptTooLongError

MAKERS = {
    "llama": lambda: LlamaForCausalLM(LlamaConfig(
        vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=32)),
    "gpt2": lambda: GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4, n_positions=32,
                                               bos_token_id=1, eos_token_id=2)),
}


@pytest.mark.parametrize("family", list(MAKERS))
def test_a_prompt_of_all_the_positions_gets_stocks_first_token(family):
    torch.manual_seed(0)
    model = MAKERS[family]().eval()
    ids = torch.randint(3, 64, (2, 32), generator=torch.Generator().manual_seed(1))
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    stock = model.generate(ids, max_new_tokens=1, **kwargs)
    hf_paged.wrap(model, PagedConfig(block_size=4, num_blocks=64))  # (32 positions: a whole number of blocks)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PositionLimitWarning)
            assert torch.equal(model.generate(ids, max_new_tokens=1, **kwargs), stock)
        outs = model.generate_batch(ids.tolist(), max_new_tokens=1, do_sample=False)
        assert [o.generated_tokens for o in outs.values()] == stock[:, 32:].tolist()
        with pytest.warns(PositionLimitWarning):  # more than the one token: rows stop there, as before
            assert torch.equal(model.generate(ids, max_new_tokens=3, **kwargs), stock)
        with pytest.raises(PromptTooLongError, match="33 tokens is longer than the model's maximum of 32"):
            model.generate(torch.randint(3, 64, (1, 33)), max_new_tokens=1, **kwargs)
        hf_paged.engine_of(model).check_integrity()
    finally:
        hf_paged.unwrap(model)
