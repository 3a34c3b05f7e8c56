"""`PagedGenerationCallback.evaluate` leaves a model in training mode in training mode (and one in eval mode in eval
mode), and `exact_match` compares texts with their surrounding whitespace stripped."""

from __future__ import annotations

import pytest

import hf_paged
from hf_paged.integrations.trainer import PagedGenerationCallback, exact_match
from tests.tiny_models import ragged_prompts, tiny_model


@pytest.mark.parametrize("training", [True, False])
def test_evaluate_restores_the_models_mode(training):
    model = tiny_model("llama").train(training)
    callback = PagedGenerationCallback(ragged_prompts([5, 3], seed=2), max_new_tokens=2)
    callback.evaluate(model)
    assert model.training is training and not hf_paged.is_wrapped(model)


def test_exact_match_strips_whitespace():
    assert exact_match([" 42\n", "7", "x"], ["42", " 7 ", "y"]) == pytest.approx(2 / 3)
    assert exact_match([], []) == 0.0
