"""generate_until on a context longer than `max_length - max_gen_toks`: PagedLM keeps the same last tokens of the
context as lm-eval's `hf` backend (HFLM left-truncates to max_length - max_gen_toks), so the greedy text is the same."""

from __future__ import annotations

import pytest

lm_eval = pytest.importorskip("lm_eval")

from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.integrations.lm_eval import PagedLM

MODEL = str(DEFAULT_MODEL_PATH)


def _request(context: str, gen_kwargs: dict, doc_id: int) -> Instance:
    return Instance(request_type="generate_until", doc={}, arguments=(context, gen_kwargs), idx=0,
                    metadata=("t", doc_id, 1))


def test_a_long_generate_context_is_cut_from_the_left_as_hf_cuts_it():
    theirs = HFLM(pretrained=MODEL, max_length=64, device="cpu", dtype="float32", batch_size=2)
    ours = PagedLM(pretrained=MODEL, max_length=64, device="cpu", dtype="float32")
    gen_kwargs = {"until": ["\n\n"], "max_gen_toks": 24, "do_sample": False}
    # contexts of ~100-200 tokens, different only at their start or their end: only the last 40 tokens count
    contexts = ["the river ran by the stone wall " * 4 + "and the garden light",
                "a paper window in the winter market " * 4 + "and the garden light",
                "the river ran by the stone wall " * 4 + "where the silver bridge"]
    assert all(len(ours.tok_encode(c)) > 64 for c in contexts)
    requests = [_request(c, gen_kwargs, d) for d, c in enumerate(contexts)]
    mine, hf = ours.generate_until(requests), theirs.generate_until(requests)
    assert mine == hf
    assert any(mine)  # something was generated to compare
