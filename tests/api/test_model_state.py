"""States of the model object the engine cannot reproduce run on stock, with a fallback warning: training mode with
dropout (stock applies it; the engine's attention has none), and a model compiled in place (the engine's stock-module
path would trace its cache code under dynamo: every call failed)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning

IDS = torch.tensor([[13, 51, 16, 20, 79, 45, 71]])


def _model(**config):
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=96, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                        pad_token_id=0, eos_token_id=None, **config)).eval()


def test_training_mode_with_dropout_runs_on_stock():
    stock = _model(attention_dropout=0.5).train()
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    torch.manual_seed(3)
    expected = stock.generate(IDS, max_new_tokens=8, do_sample=False)
    torch.manual_seed(3)
    with pytest.warns(PagedFallbackWarning, match="training mode"):
        got = wrapped.generate(IDS, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, expected)  # dropout applied, as stock applies it (the same draws)
    wrapped.eval()
    stock.eval()
    with warnings.catch_warnings():
        warnings.simplefilter("error", PagedFallbackWarning)  # eval: the engine
        got = wrapped.generate(IDS, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, stock.generate(IDS, max_new_tokens=8, do_sample=False))


def test_training_mode_without_dropout_stays_on_the_engine():
    stock = _model().train()  # attention_dropout 0: nothing to apply
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    with warnings.catch_warnings():
        warnings.simplefilter("error", PagedFallbackWarning)
        got = wrapped.generate(IDS, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, stock.generate(IDS, max_new_tokens=8, do_sample=False))


@pytest.mark.parametrize("how", ["module.compile()", "forward = torch.compile(forward)"])
def test_a_model_compiled_in_place_runs_on_stock(how):
    stock = _model()
    expected = stock.generate(IDS, max_new_tokens=4, do_sample=False)
    wrapped = hf_paged.wrap(copy.deepcopy(stock))
    if how == "module.compile()":
        wrapped.compile(backend="eager")  # (dynamo's tracing alone: no code generation, seconds on a CPU)
    else:
        wrapped.forward = torch.compile(wrapped.forward, backend="eager")
    with pytest.warns(PagedFallbackWarning, match="compiled in place"):
        assert torch.equal(wrapped.generate(IDS, max_new_tokens=4, do_sample=False), expected)


def test_generate_batch_in_training_mode_with_dropout_says_it_applies_none():
    wrapped = hf_paged.wrap(_model(attention_dropout=0.5).train())
    with pytest.warns(UserWarning, match="model.eval"):
        wrapped.generate_batch([IDS[0].tolist()], max_new_tokens=2)
