"""`generate(min_new_tokens=..., logits_processor=[a constraint])` raised the engine's refusal (EOS held back past a
document's end leaves nothing allowed) where stock returns a document (h9): it runs stock now, with one
`PagedFallbackWarning`, and gives stock's tokens."""

from __future__ import annotations

import copy

import pytest
import torch

import hf_paged
from hf_paged import RegexLogitsProcessor
from hf_paged.api.generate import PagedFallbackWarning
from tests.batching.test_constrained_engine import model_and_tokenizer


@pytest.mark.parametrize("minimum", [{"min_new_tokens": 1}, {"min_length": 6}])
def test_a_minimum_beside_a_constraint_runs_stock(minimum):
    model, tok = model_and_tokenizer()
    ids = torch.tensor([tok("go ")["input_ids"]])
    kwargs = dict(max_new_tokens=8, do_sample=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id,
                  attention_mask=torch.ones_like(ids), **minimum)
    stock = copy.deepcopy(model).generate(ids, logits_processor=[RegexLogitsProcessor(r"[a-h]{3}", tok)], **kwargs)
    hf_paged.wrap(model)
    with pytest.warns(PagedFallbackWarning, match="min_new_tokens / min_length beside a constrained"):
        out = model.generate(ids, logits_processor=[RegexLogitsProcessor(r"[a-h]{3}", tok)], **kwargs)
    assert out.tolist() == stock.tolist()
