"""A stopping criterion may answer one bool for the whole batch (stock's `StoppingCriteriaList` broadcasts it over the
rows): every row stops at that step, token-identical to stock, and a masked hole inside a prompt is not right
padding (no `RightPaddingWarning`). h86's mutation audit (M30: the one-value broadcast dropped, M22: a mask hole
counted as right padding) passed every API test."""

from __future__ import annotations

import warnings

import torch
from transformers import StoppingCriteria

import hf_paged
from hf_paged.api.generate import RightPaddingWarning
from tests.tiny_models import left_pad, ragged_prompts, tiny_model


class AllDoneAfter(StoppingCriteria):
    """One verdict for the batch: done once `steps` tokens follow the prompt."""

    def __init__(self, prompt_len: int, steps: int) -> None:
        self.prompt_len, self.steps = prompt_len, steps

    def __call__(self, input_ids, scores, **kwargs):
        return torch.tensor([input_ids.shape[1] - self.prompt_len >= self.steps])


def test_one_verdict_stops_every_row_as_stock_does():
    stock, wrapped = tiny_model("llama"), hf_paged.wrap(tiny_model("llama"))
    ids, mask = left_pad(ragged_prompts([5, 11], seed=4), 0)

    def run(model):
        criteria = [AllDoneAfter(ids.shape[1], 4)]  # a plain list, as lm-eval and most scripts pass it
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # no fallback: the engine runs it
            return model.generate(ids, attention_mask=mask, max_new_tokens=12, do_sample=False,
                                  stopping_criteria=criteria).tolist()

    expected = run(stock)
    assert [len(row) - ids.shape[1] for row in expected] == [4, 4]
    assert run(wrapped) == expected


def test_a_hole_in_a_mask_is_not_right_padding():
    stock, wrapped = tiny_model("llama"), hf_paged.wrap(tiny_model("llama"))
    ids = torch.tensor([[5, 6, 7, 8, 9, 10], [11, 12, 13, 14, 15, 16]])
    mask = torch.tensor([[1, 1, 0, 1, 1, 1], [1, 1, 1, 1, 1, 1]])
    with warnings.catch_warnings():
        warnings.simplefilter("error", RightPaddingWarning)
        got = wrapped.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False)
    assert got.tolist() == stock.generate(ids, attention_mask=mask, max_new_tokens=6, do_sample=False).tolist()
