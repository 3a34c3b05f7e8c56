"""`loglikelihood_rolling` of a document that spans several windows: `is_greedy` only when every window's tokens
are greedy (one greedy window among others is not a greedy document); a continuation token outside the vocabulary,
the last one included (it is no prompt token, so the engine's prompt check never sees it), is refused by name."""

from __future__ import annotations

import pytest
import torch

import hf_paged
from hf_paged.api.scoring import rolling_windows
from hf_paged.errors import InvalidPromptError
from tests.tiny_models import VOCAB, tiny_model


@pytest.fixture(scope="module")
def model():
    wrapped = hf_paged.wrap(tiny_model("llama"))
    yield wrapped
    hf_paged.unwrap(wrapped)


def test_a_document_is_greedy_only_when_every_window_is(model):
    greedy = model.generate(torch.tensor([[1]]), max_new_tokens=4, do_sample=False)[0, 1:].tolist()
    document = greedy + [17, 17, 17, 17]  # the first window is the greedy text; the second is not
    windows = rolling_windows(document, 1, 4)
    assert windows[0] == ([1], greedy)
    per_window = [r.is_greedy for r in model.loglikelihood(windows)]
    assert per_window[0] and not all(per_window)
    assert model.loglikelihood_rolling([document], max_length=4)[0].is_greedy is False
    assert model.loglikelihood_rolling([greedy], max_length=4)[0].is_greedy is True


@pytest.mark.parametrize("continuation", [[VOCAB + 3], [5, VOCAB + 3], [VOCAB, 5]])
def test_a_continuation_token_outside_the_vocabulary_is_refused(model, continuation):
    with pytest.raises(InvalidPromptError, match="outside the vocabulary"):
        model.loglikelihood([([1, 5], continuation)])
    assert model.loglikelihood([([1, 5], [6])])[0].logprob < 0  # the engine is fine afterwards
