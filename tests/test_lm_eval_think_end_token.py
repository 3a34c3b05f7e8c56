"""`think_end_token` given as a token id: as lm-eval's hf backend does, PagedLM keeps only the tokens after its LAST
occurrence in the generated tokens (a model may close several thinking sections), left-stripped, then cuts at the
first `until` string (and, as hf, left-strips the text also when the mark is absent)."""

from __future__ import annotations

import pytest

lm_eval = pytest.importorskip("lm_eval")

from hf_paged.api.models import DEFAULT_MODEL_PATH
from hf_paged.integrations.lm_eval import PagedLM


def test_the_answer_follows_the_last_think_end_token():
    lm = PagedLM(pretrained=str(DEFAULT_MODEL_PATH), device="cpu", dtype="float32", max_length=64)
    think_end = lm.tok_encode("|")[-1]
    lm.think_end_token = think_end  # as HFLM(think_end_token=<id>) sets it
    enc = lm.tok_encode
    tokens = enc("plan a") + [think_end] + enc("plan b") + [think_end] + enc("  the answer\nmore")
    assert lm._postprocess(tokens, ["\n"]) == "the answer"
    assert lm._postprocess(enc(" no thinking\n"), ["\n"]) == "no thinking"  # no mark: left-stripped all the same (hf)
