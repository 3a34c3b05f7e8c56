"""No `attention_mask` and `pad_token_id == eos_token_id` (GPT-2 style checkpoints, chat text with EOS between turns):
stock counts every token (its `_prepare_attention_mask_for_generation` cannot tell an EOS from padding), so the
engine must keep the EOS tokens in the prompt, leading ones included, and give stock's tokens without a fallback."""

from __future__ import annotations

import copy
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning


def test_eos_tokens_in_the_prompt_count_when_pad_is_eos_and_no_mask_is_given():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=2,
                         eos_token_id=2, bos_token_id=1)
    stock = LlamaForCausalLM(config).eval()
    ids = torch.tensor([[2, 15, 33, 2, 40, 41], [7, 2, 2, 60, 12, 9]])
    expected = stock.generate(ids, max_new_tokens=6, do_sample=False)
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)
            got = wrapped.generate(ids, max_new_tokens=6, do_sample=False)
        assert got.tolist() == expected.tolist()
    finally:
        hf_paged.unwrap(wrapped)
