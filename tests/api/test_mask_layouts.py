"""Inputs the engine used to answer differently from stock with no word: right padding (continued after the last
real token, with a `RightPaddingWarning`), a mask with zeros after a row's first token on a sliding-window model, a
dynamic-NTK model past its positions, and stock's quantized KV cache (these three run on stock, with a fallback
warning, as stock answers them)."""

from __future__ import annotations

import copy
import warnings

import pytest
import torch
from transformers import GenerationConfig, LlamaConfig, LlamaForCausalLM, MistralConfig, MistralForCausalLM

import hf_paged
from hf_paged.api.generate import PagedFallbackWarning, RightPaddingWarning

COMMON = {"vocab_size": 96, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
          "num_attention_heads": 4, "num_key_value_heads": 2, "pad_token_id": 0, "eos_token_id": None}


def _pair(model):
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(3)  # (random weights this small barely depend on what they attend otherwise)
    return model.eval(), hf_paged.wrap(copy.deepcopy(model.eval()))


@pytest.fixture(scope="module")
def llama():
    torch.manual_seed(0)
    return _pair(LlamaForCausalLM(LlamaConfig(max_position_embeddings=64, **COMMON)))


@pytest.fixture(scope="module")
def mistral():
    torch.manual_seed(0)
    return _pair(MistralForCausalLM(MistralConfig(max_position_embeddings=64, sliding_window=6, **COMMON)))


ROWS = [[13, 51, 16, 20, 79, 45, 71], [17, 75, 60]]


def test_right_padding_continues_after_the_last_real_token_with_a_warning(llama):
    stock, wrapped = llama
    right = torch.tensor([ROWS[0], ROWS[1] + [0] * 4])
    left = torch.tensor([ROWS[0], [0] * 4 + ROWS[1]])
    expected = stock.generate(left, attention_mask=(left != 0).long(), max_new_tokens=6, do_sample=False)
    with pytest.warns(RightPaddingWarning, match=r"rows \[1\]"):
        got = wrapped.generate(right, attention_mask=(right != 0).long(), max_new_tokens=6, do_sample=False)
    assert torch.equal(got[:, 7:], expected[:, 7:])  # the new tokens of the same rows padded on the left
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # left padding: no word
        wrapped.generate(left, attention_mask=(left != 0).long(), max_new_tokens=2, do_sample=False)


@pytest.mark.parametrize("row_mask", [[1, 0, 1, 0, 0], [0, 1, 0, 1, 0], [1, 1, 0, 1, 0]])
@pytest.mark.parametrize("inferred", [False, True])
def test_a_row_with_a_hole_and_right_padding_is_right_padded(llama, row_mask, inferred):
    """A hole and zeros at the end: continued after its last real token with a `RightPaddingWarning`, as a
    right-padded row (was: stock's answer differed, without a word; found by a hostile pass, h6)."""
    stock, wrapped = llama
    full, row = [21, 22, 23, 24, 25], [11, 12, 13, 14, 15]
    tail = len(row_mask) - max(i for i, m in enumerate(row_mask) if m) - 1  # the zeros at the end, moved to the left
    mask = torch.tensor([[1] * 5, row_mask])
    left_mask = torch.tensor([[1] * 5, row_mask[-tail:] + row_mask[:-tail]])
    ids = torch.tensor([full, [t if m else 0 for t, m in zip(row, row_mask)]])
    left = torch.tensor([full, [t if m else 0 for t, m in zip(row[-tail:] + row[:-tail], left_mask[1].tolist())]])
    expected = stock.generate(left, attention_mask=left_mask, max_new_tokens=4, do_sample=False)
    with pytest.warns(RightPaddingWarning, match=r"rows \[1\]"):  # the mask given, or inferred from the pads
        got = wrapped.generate(ids, **({} if inferred else {"attention_mask": mask}), max_new_tokens=4,
                               do_sample=False)
    assert torch.equal(got[:, 5:], expected[:, 5:])


@pytest.mark.parametrize("layout", ["hole", "right"])
def test_masked_slots_on_a_sliding_window_model_run_on_stock(mistral, layout):
    """Stock's window counts slots, masked ones included; the engine keeps real tokens only: stock answers."""
    stock, wrapped = mistral
    ids = torch.tensor([ROWS[0] + [9, 10], [17, 0, 0, 75, 60, 33, 21, 8, 4] if layout == "hole" else ROWS[1] + [0] * 6])
    mask = (ids != 0).long()
    expected = stock.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    with pytest.warns(PagedFallbackWarning, match="sliding-window"):
        got = wrapped.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert torch.equal(got, expected)


def test_dynamic_ntk_past_the_positions_runs_on_stock():
    torch.manual_seed(0)
    stock, wrapped = _pair(LlamaForCausalLM(LlamaConfig(
        max_position_embeddings=16, rope_parameters={"rope_type": "dynamic", "factor": 8.0, "rope_theta": 10000.0},
        **COMMON)))
    short, long = torch.tensor([ROWS[0]]), torch.tensor([ROWS[0] * 2])
    with warnings.catch_warnings():
        warnings.simplefilter("error", PagedFallbackWarning)
        assert torch.equal(wrapped.generate(short, max_new_tokens=6, do_sample=False),
                           stock.generate(short, max_new_tokens=6, do_sample=False))  # within: the engine
    with pytest.warns(PagedFallbackWarning, match="dynamic NTK"):
        got = wrapped.generate(long, max_new_tokens=8, do_sample=False)
    assert torch.equal(got, stock.generate(long, max_new_tokens=8, do_sample=False))


def test_stocks_quantized_cache_is_not_ignored(llama):
    stock, wrapped = llama
    ids = torch.tensor([ROWS[0]])
    kwargs = {"max_new_tokens": 6, "do_sample": False, "cache_implementation": "quantized",
              "cache_config": {"backend": "fp8"}}
    try:
        expected = stock.generate(ids, **kwargs)
    except Exception as error:  # noqa: BLE001 -- whatever stock raises here, the wrapped model raises too
        with pytest.warns(PagedFallbackWarning, match="quantized"), pytest.raises(type(error)):
            wrapped.generate(ids, **kwargs)
    else:
        with pytest.warns(PagedFallbackWarning, match="quantized"):
            assert torch.equal(wrapped.generate(ids, **kwargs), expected)
    with pytest.raises(hf_paged.errors.UnsupportedGenerationError, match="kv_cache_dtype"):
        wrapped.generate_batch([[5, 6, 7]], GenerationConfig(max_new_tokens=2, cache_implementation="quantized"))
