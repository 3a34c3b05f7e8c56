"""What stock `generate`'s processors read from a padded batch, the engine's read too: a mask worked out from
`pad_token_id` when none is given, `min_length` and `forced_eos_token_id` counted on the padded length,
`no_repeat_ngram_size` / `repetition_penalty` over the pads; what the engine cannot read (encoder penalties, DoLa)
falls back to stock. Each case: the same tokens as stock, without a fallback where the engine runs."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning

IDS = torch.tensor([[0, 0, 0, 0, 13, 51, 16, 20, 79], [45, 71, 17, 75, 60, 44, 5, 28, 67]])
MASK = (IDS != 0).long()
ODD_PADS = IDS.clone()
ODD_PADS[0, :4] = 87  # pads whose id is a real token: stock's processors see them


@pytest.fixture(scope="module")
def models():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
                         eos_token_id=2)
    stock = LlamaForCausalLM(config).eval()
    return stock, hf_paged.wrap(copy.deepcopy(stock))


CASES = {
    "no mask: padding from pad_token_id": (IDS, {"max_new_tokens": 6}),
    "min_length counts the padded row": (IDS, {"attention_mask": MASK, "max_new_tokens": 12, "min_length": 14,
                                               "eos_token_id": 31}),
    "forced_eos_token_id at the last new token": (IDS, {"attention_mask": MASK, "max_new_tokens": 6,
                                                        "forced_eos_token_id": 5}),
    "forced_eos_token_id, one row": (IDS[1:], {"max_new_tokens": 6, "forced_eos_token_id": 5}),
    "no_repeat_ngram_size over the pads": (ODD_PADS, {"attention_mask": MASK, "max_new_tokens": 4,
                                                      "no_repeat_ngram_size": 1, "pad_token_id": 87,
                                                      "eos_token_id": None}),
    "repetition_penalty over the pads": (ODD_PADS, {"attention_mask": MASK, "max_new_tokens": 8,
                                                    "repetition_penalty": 3.0, "pad_token_id": 87}),
    "begin_suppress_tokens on the padded batch": (IDS, {"attention_mask": MASK, "max_new_tokens": 5,
                                                        "begin_suppress_tokens": [13, 45]}),
}


@pytest.mark.parametrize("name", list(CASES))
def test_padded_batches_give_stocks_tokens_on_the_engine(models, name):
    stock, wrapped = models
    inputs, kwargs = CASES[name]
    expected = stock.generate(inputs, **kwargs)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PagedFallbackWarning)
        got = wrapped.generate(inputs, **kwargs)
    assert torch.equal(got, expected), (got.tolist(), expected.tolist())


@pytest.mark.parametrize("kwargs", [{"encoder_repetition_penalty": 1.5}, {"encoder_no_repeat_ngram_size": 2}])
def test_encoder_penalties_fall_back_to_stock(models, kwargs):
    stock, wrapped = models
    expected = stock.generate(IDS, attention_mask=MASK, max_new_tokens=6, **kwargs)
    with pytest.warns(PagedFallbackWarning, match="encoder_repetition_penalty"):
        got = wrapped.generate(IDS, attention_mask=MASK, max_new_tokens=6, **kwargs)
    assert torch.equal(got, expected)
    with pytest.raises(hf_paged.errors.UnsupportedGenerationError, match="encoder_repetition_penalty"):
        wrapped.generate_batch([[5, 6, 7]], GenerationConfig(max_new_tokens=4, **kwargs))


def test_generate_batch_forces_eos_at_each_requests_last_token(models):
    _, wrapped = models
    outputs = wrapped.generate_batch([[5, 6, 7], [8, 9, 10, 11]], GenerationConfig(max_new_tokens=4,
                                                                                  forced_eos_token_id=5))
    for output in outputs.values():
        assert len(output.generated_tokens) <= 4 and output.generated_tokens[-1] == 5


def test_int32_input_ids_give_int64_sequences_as_stock(models):
    stock, wrapped = models
    expected = stock.generate(IDS.int(), attention_mask=MASK, max_new_tokens=3)
    got = wrapped.generate(IDS.int(), attention_mask=MASK, max_new_tokens=3)
    assert got.dtype == expected.dtype == torch.int64 and torch.equal(got, expected)


def test_keywords_stock_refuses_are_not_swallowed(models):
    """`use_model_defaults` is no argument of stock's `generate` (transformers 5): it falls back, and stock refuses
    it, as it would unwrapped."""
    stock, wrapped = models
    with pytest.raises(ValueError, match="use_model_defaults"):
        stock.generate(IDS, attention_mask=MASK, max_new_tokens=2, use_model_defaults=False)
    with pytest.warns(PagedFallbackWarning), pytest.raises(ValueError, match="use_model_defaults"):
        wrapped.generate(IDS, attention_mask=MASK, max_new_tokens=2, use_model_defaults=False)


def test_labels_beside_generate_run_on_the_engine(models):
    """Seq2SeqTrainer(predict_with_generate=True) passes `labels` for decoder-only models too: every call fell back
    to stock (the labels only make stock's forwards compute a loss)."""
    stock, wrapped = models
    expected = stock.generate(IDS, attention_mask=MASK, max_new_tokens=4, labels=IDS)
    with warnings.catch_warnings():
        warnings.simplefilter("error", PagedFallbackWarning)
        assert torch.equal(wrapped.generate(IDS, attention_mask=MASK, max_new_tokens=4, labels=IDS), expected)
