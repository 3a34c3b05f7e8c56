"""Special-token defaults the engine must take as stock does: a model that names no pad token pads its finished rows
with its (first) EOS id, as stock `generate` does; `loglikelihood_rolling` puts the model's BOS id before a
document, and its EOS id only for a model without a BOS."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning

IDS = torch.tensor([[5, 6, 7, 8], [40, 41, 42, 43], [70, 12, 33, 9]])


def _llama(**special) -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, **special)
    model = LlamaForCausalLM(config).eval()
    model.generation_config.pad_token_id = special.get("pad_token_id")
    model.generation_config.eos_token_id = special.get("eos_token_id")
    return model


def test_rows_that_end_early_are_padded_with_eos_when_the_model_names_no_pad_token():
    stock = _llama(pad_token_id=None, eos_token_id=None, bos_token_id=1)
    free = stock.generate(IDS, attention_mask=torch.ones_like(IDS), max_new_tokens=6, do_sample=False)
    eos = int(free[0, 5])  # row 0's second new token: it ends there, the other rows run on
    assert eos not in free[1:, 4:].flatten().tolist()
    stock.generation_config.eos_token_id = eos
    expected = stock.generate(IDS, attention_mask=torch.ones_like(IDS), max_new_tokens=6, do_sample=False)
    assert expected[0, 6:].tolist() == [eos] * 4  # stock pads with its EOS id (pad_token_id None)
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", PagedFallbackWarning)
            got = wrapped.generate(IDS, attention_mask=torch.ones_like(IDS), max_new_tokens=6, do_sample=False)
        assert got.tolist() == expected.tolist()
    finally:
        hf_paged.unwrap(wrapped)


def test_rolling_scores_start_after_the_bos_id_when_the_model_names_bos_and_eos():
    model = hf_paged.wrap(_llama(pad_token_id=0, eos_token_id=2, bos_token_id=1))
    try:
        documents = [[7, 19, 33, 4, 60, 12]]
        default = model.loglikelihood_rolling(documents)[0].logprob
        after_bos = model.loglikelihood_rolling(documents, prefix_token_id=1)[0].logprob
        after_eos = model.loglikelihood_rolling(documents, prefix_token_id=2)[0].logprob
        assert default == after_bos and after_bos != pytest.approx(after_eos, abs=1e-6)
    finally:
        hf_paged.unwrap(model)
