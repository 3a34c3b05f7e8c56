"""`tokens.forced` counts exactly the generated tokens that lie wholly inside a template's forced literals: with the
byte tokenizer (one token a character) that is the literals' length after each closed hole, in both fill modes
(one shot: counted over the one request's tokens; item by item: each field's request counts the literal it ends
with)."""

from __future__ import annotations

import pytest

from hf_paged import programs as hp

TEMPLATE = "id: [a], code: [b]."  # literals after the holes: ", code: " (8 characters) and "." (1)


@pytest.mark.parametrize("mode", ["one_shot", "item_by_item"])
def test_forced_is_the_literals_tokens_after_each_hole(model_tok, mode):
    model, tok = model_tok
    filled = hp.fill(model, tok, "Record:\n", TEMPLATE, mode=mode, a=hp.regex("[0-9]{3}"), b=hp.regex("[a-z]{2}"))
    assert filled.valid and filled.finish_reasons == {"a": "stop", "b": "stop"}
    assert filled.text == f"id: {filled.fields['a']}, code: {filled.fields['b']}."
    assert filled.tokens.forced == len(", code: ") + len(".")
    if mode == "item_by_item":  # each field's request forced the literal after it, within its budget
        assert {name: d.tokens.forced for name, d in filled.details.items()} == {"a": 8, "b": 1}
    else:  # one request: 3 digits, the literal, 2 letters, ".", EOS
        assert filled.tokens.requests == 1 and filled.tokens.generated == 3 + 8 + 2 + 1 + 1
