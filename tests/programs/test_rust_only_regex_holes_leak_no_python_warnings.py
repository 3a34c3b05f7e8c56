"""A hole's regex in Rust-only syntax is never read by Python's `re` where Python reads it otherwise (h4 P10): a
one-shot template split its output with `re.compile([a-z&&[^aeiou]]{3})`, which warned "Possible set intersection"
(FutureWarning) and read another class; the split now goes by the literals alone for such a pattern."""

from __future__ import annotations

import warnings

import pytest

from hf_paged import programs as hp
from hf_paged.processors.automaton.byte_dfa import anchored, build_byte_dfa


@pytest.mark.parametrize("template", ["A=[a] end", '{"a": "[a]"}'])
@pytest.mark.parametrize("mode", ["one_shot", "item_by_item"])
def test_a_rust_class_hole_fills_without_python_warnings(model_tok, template, mode):
    model, tok = model_tok
    pattern = r"[a-z&&[^aeiou]]{3}"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        filled = hp.fill(model, tok, "Data:\n", template, mode=mode, a=hp.regex(pattern))
    value = filled.fields["a"]
    assert build_byte_dfa(anchored(pattern)).accepts(value.encode()) and filled.details["a"].valid
    assert filled.text == template.replace("[a]", value)
