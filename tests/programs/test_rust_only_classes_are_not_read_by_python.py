"""Rust reads `[a-z&&[^aeiou]]` as the consonants; Python's `re` reads `[a-z&&[^aeiou]` and a literal `]`. A regex
hole between quotes was built by the JSON-string translator, which read the pattern with Python: the field came
out as 'v]]]' (valid=True), a value the pattern does not match; it is built from the Rust reading now. Where
Python's reading only helps to split a one-shot output or to cut a value, a pattern with such a class is not read
by Python at all (the one-shot field was redone item by item)."""

from __future__ import annotations

import re

import pytest

from hf_paged import programs as hp
from hf_paged.programs.hole_regex import python_regex, rust_only_classes

CONSONANTS = r"[a-z&&[^aeiou]]{3}"


@pytest.mark.parametrize("mode", ["item_by_item", "one_shot"])
def test_a_json_string_hole_with_a_nested_class_reads_it_as_rust(model_tok, mode):
    """(The hole's body is built from the Rust reading now, `processors.schema.regex_string_body`: the consonants.)"""
    model, tok = model_tok
    filled = hp.fill(model, tok, "P: ", '{"a": "[a]"}', mode=mode, a=hp.regex(CONSONANTS))
    assert re.fullmatch("[b-df-hj-np-tv-z]{3}", filled.fields["a"]) and filled.valid


def test_a_one_shot_hole_with_a_nested_class_is_split_without_python(model_tok):
    model, tok = model_tok
    filled = hp.fill(model, tok, "P: ", "A=[a] end", mode="one_shot", a=hp.regex(CONSONANTS))
    assert re.fullmatch("[b-df-hj-np-tv-z]{3}", filled.fields["a"]) and filled.valid
    assert filled.attempts == {"a": 1} and filled.tokens.requests == 1  # taken from the one generation


def test_which_classes_python_reads_otherwise():
    assert rust_only_classes(CONSONANTS) == ["[a-z&&[^aeiou]]"]
    assert rust_only_classes("[[:alpha:]]x[a-c--b][a~~b]") == ["[[:alpha:]]", "[a-c--b]", "[a~~b]"]
    assert rust_only_classes(r"[\[]\[a&&b\][]a][^]-][a\-\-b]") == []
    assert python_regex(CONSONANTS) is None and python_regex("[a-z]{3}").fullmatch("abc")
