"""A choices hole between quotes, scored by `select`: the text gets the choice as a JSON string body (its quote and
backslash escaped), so the filled template is valid JSON whose value is the choice itself, whichever is picked."""

from __future__ import annotations

import json

import pytest

from hf_paged import programs as hp


@pytest.mark.parametrize("choices", [['say "hi"', 'a\\b'], ['a\\b', 'say "hi"']])
def test_a_scored_choice_with_a_quote_or_backslash_stays_valid_json(model_tok, choices):
    model, tok = model_tok
    filled = hp.fill(model, tok, "Pick one.\n", '{"quote": "[q]", "n": 1}', q=choices)
    assert filled.details["q"].finish_reason == "scored"
    assert filled.fields["q"] in choices
    assert json.loads(filled.text) == {"quote": filled.fields["q"], "n": 1}
