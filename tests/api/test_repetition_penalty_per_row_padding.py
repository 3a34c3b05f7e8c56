"""`repetition_penalty` on a left-padded batch: each row skips its own leading padding (stock's
`prompt_ignore_length`), so a row without padding is penalised for its first tokens even when the row before it
had padding (the processor lists are built per padding length, never shared across lengths)."""

from __future__ import annotations

import copy
import warnings

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning


def test_a_row_without_padding_is_penalised_for_its_first_tokens_after_a_padded_row():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         eos_token_id=2)
    stock = LlamaForCausalLM(config).eval()
    # row 1 begins with what the model would write itself (87, 20, 85, 18): penalised, it picks EOS at step 5;
    # a list that skipped row 0's 4 pads in row 1 too would let it write 87 again
    ids = torch.tensor([[0, 0, 0, 0, 13, 51, 16, 20, 79], [87, 20, 85, 18, 40, 80, 19, 63, 7]])
    mask = torch.tensor([[0] * 4 + [1] * 5, [1] * 9])
    kwargs = {"attention_mask": mask, "max_new_tokens": 6, "repetition_penalty": 5.0, "do_sample": False}
    expected = stock.generate(ids, **kwargs)
    assert expected[1, 9:].tolist()[4] == 2
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)
            got = wrapped.generate(ids, **kwargs)
        assert got.tolist() == expected.tolist()
    finally:
        hf_paged.unwrap(wrapped)
