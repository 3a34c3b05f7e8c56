"""More new tokens than the model's positions hold: the engine stops rows at `max_position_embeddings` where stock
`generate` goes on (issue 36: the shorter answer came back without a word). It now says so with a warning; the tokens
it does return are stock's."""

from __future__ import annotations

import warnings

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import hf_paged
from hf_paged.api.generate import PositionLimitWarning


@pytest.fixture(scope="module")
def short_model():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32)
    return LlamaForCausalLM(config).eval()


def test_generate_past_the_positions_warns_and_returns_stocks_tokens_up_to_them(short_model):
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    ref = short_model.generate(ids, max_new_tokens=40, **kwargs)
    hf_paged.wrap(short_model)
    try:
        with pytest.warns(PositionLimitWarning, match="maximum of 32 positions.*max_new_tokens=40"):
            out = short_model.generate(ids, max_new_tokens=40, **kwargs)
        assert out.shape == (1, 32) and ref.shape == (1, 45)
        assert torch.equal(out, ref[:, :32])
        with warnings.catch_warnings():
            warnings.simplefilter("error", PositionLimitWarning)
            assert short_model.generate(ids, max_new_tokens=27, **kwargs).shape == (1, 32)  # fits: no warning
    finally:
        hf_paged.unwrap(short_model)


@pytest.mark.parametrize("length_kwargs", [{}, {"max_length": 24}, {"max_length": 25}, {"max_length": 8}])
def test_the_length_without_max_new_tokens_is_stocks(short_model, length_kwargs):
    """No `max_new_tokens`: stock runs 20 new tokens past the prompt (within the positions) when no max_length is
    set anywhere, and refuses a prompt at or past an explicit `max_length` with its ValueError (was: 1 new token,
    for every prompt of 20 tokens or more, and 1 token past a max_length the prompt already reached)."""
    ids = torch.tensor([[5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23, 24, 25, 26, 27, 28]])
    kwargs = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None, **length_kwargs}
    results = []
    for wrapped in (False, True):
        if wrapped:
            hf_paged.wrap(short_model)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                results.append(short_model.generate(ids, **kwargs))
        except ValueError as exc:
            results.append(str(exc))
        finally:
            if wrapped:
                hf_paged.unwrap(short_model)
    ref, out = results
    if isinstance(ref, str):
        assert out == ref and "Input length of input_ids is 24" in ref
    else:
        assert isinstance(out, torch.Tensor) and torch.equal(out, ref), (out.shape, ref.shape)
        assert ref.shape[1] == {(): 32, ("max_length",): 25}[tuple(length_kwargs)]


def test_generate_batch_without_max_new_tokens_runs_to_the_positions(short_model):
    """transformers' `generate_batch` reads no `max_length`: without `max_new_tokens` a request has no limit (it
    runs to EOS); the engine ends it at the model's positions (was: SamplingParams' default of 20 new tokens)."""
    from transformers import GenerationConfig

    config = GenerationConfig(do_sample=False, eos_token_id=None, pad_token_id=0)
    hf_paged.wrap(short_model)
    try:
        outs = short_model.generate_batch([[5, 6, 7], [5] * 10], config)
        assert [len(o.generated_tokens) for o in outs.values()] == [29, 22]
        assert len(short_model.generate_batch([[5, 6, 7]], config, max_new_tokens=4)["req_0"].generated_tokens) == 4
    finally:
        hf_paged.unwrap(short_model)


def test_generate_batch_refuses_the_limits_it_does_not_read(short_model):
    """`max_time` and `max_length` (transformers' `generate_batch` reads neither): a limit the caller named was dropped
    silently, 2,000 tokens for max_time=0.2 (found by a hostile pass, session 30)."""
    from transformers import GenerationConfig

    hf_paged.wrap(short_model)
    try:
        with pytest.raises(ValueError, match="max_time"):
            short_model.generate_batch([[5, 6, 7]], max_new_tokens=8, max_time=0.2)
        with pytest.raises(ValueError, match="max_time"):
            short_model.generate_batch([[5, 6, 7]], GenerationConfig(max_new_tokens=8, max_time=0.2))
        with pytest.raises(ValueError, match="max_length=12.*give max_new_tokens"):
            short_model.generate_batch([[5, 6, 7]], max_length=12)
        out = short_model.generate_batch([[5, 6, 7]], max_length=12, max_new_tokens=3)  # (max_new_tokens rules)
        assert len(out["req_0"].generated_tokens) == 3
    finally:
        hf_paged.unwrap(short_model)


def test_generate_batch_names_the_max_length_of_a_generation_config_it_does_not_read(short_model):
    """max_length in `generation_config=` or in `model.generation_config` was dropped silently where the keyword is
    refused: the request ran to the model's positions (found by a hostile pass, h6). It is a warning there, not an
    error: checkpoints ship max_length (Llama 2: 4096) and transformers' own generate_batch ignores it too."""
    from transformers import GenerationConfig

    hf_paged.wrap(short_model)
    saved = short_model.generation_config.max_length
    try:
        with pytest.warns(PositionLimitWarning, match=r"generation_config\.max_length=10.*give max_new_tokens"):
            short_model.generate_batch([[5, 6, 7]], generation_config=GenerationConfig(max_length=10))
        with warnings.catch_warnings():
            warnings.simplefilter("error", PositionLimitWarning)
            out = short_model.generate_batch([[5, 6, 7]], GenerationConfig(max_length=10, max_new_tokens=3))
            assert len(out["req_0"].generated_tokens) == 3  # (max_new_tokens rules, as in stock)
        short_model.generation_config.max_length = 10
        with pytest.warns(PositionLimitWarning, match=r"model\.generation_config\.max_length=10"):
            short_model.generate_batch([[5, 6, 7]])
        assert len(short_model.generate_batch([[5, 6, 7]], max_new_tokens=2)["req_0"].generated_tokens) == 2
    finally:
        short_model.generation_config.max_length = saved
        hf_paged.unwrap(short_model)
