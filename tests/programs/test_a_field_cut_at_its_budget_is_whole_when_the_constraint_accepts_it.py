"""A constrained field gets one token more than its budget (for EOS); when that spare token went into the value
instead, the value is cut back to `max_tokens` tokens, and whether what is left is whole is the constraint's own
answer (its automaton in an accepting state there), not a blanket "length_incomplete": an open-ended regex cut at
its budget is a complete match ("length", valid), and a validator that accepts it spends no retry."""

from __future__ import annotations

import re

import pytest

from hf_paged import programs as hp
from hf_paged.programs.backend import Guide
from hf_paged.programs.local import LocalBackend


def _one(model, tok, pattern, **options):
    @hp.program
    def field(s):
        s += "Name: " + hp.gen("x", max_tokens=6, regex=pattern, **options)

    state = field.run(model, tok)
    (record,) = state.calls
    return state["x"], record


def test_an_open_ended_regex_cut_at_its_budget_is_a_whole_match(model_tok):
    model, tok = model_tok
    value, record = _one(model, tok, r"[a-z]{3,}")
    assert record.tokens.generated == 7  # the spare token went into the value (greedy: a letter, not EOS)
    assert len(value) == 6 and re.fullmatch(r"[a-z]{3,}", value)
    assert (record.finish_reason, record.valid) == ("length", True)


def test_a_validator_that_accepts_the_cut_value_spends_no_retry(model_tok):
    model, tok = model_tok
    value, record = _one(model, tok, r"[a-z]{3,}", validator=lambda v: len(v) > 2, max_retries=2)
    assert [(a.value, a.finish_reason, a.valid) for a in record.attempts] == [(value, "length", True)]
    assert record.tokens.requests == 1


def test_a_value_cut_where_the_constraint_is_not_whole_stays_incomplete(model_tok):
    model, tok = model_tok
    value, record = _one(model, tok, r"[a-z]{8,}")  # 6 letters do not match
    assert len(value) == 6 and (record.finish_reason, record.valid) == ("length_incomplete", False)
    # whole after 7 tokens (what the engine saw), not after the 6 kept: the kept tokens decide
    value, record = _one(model, tok, r"[a-z]{5}|[a-z]{7}")
    assert record.tokens.generated == 7 and len(value) == 6
    assert (record.finish_reason, record.valid) == ("length_incomplete", False)


def test_the_backend_asks_the_processors_automaton(model_tok):
    model, tok = model_tok
    backend = LocalBackend(model, tok)
    guide = Guide("regex", "(?:ab)*")
    ids = tok("abab", add_special_tokens=False)["input_ids"]
    assert backend.accepts(guide, ids) and backend.accepts(guide, [])
    assert not backend.accepts(guide, ids[:3])
    assert not backend.accepts(guide, tok("abc", add_special_tokens=False)["input_ids"])  # a refused token


@pytest.mark.parametrize("pattern", [r"\p{Ll}{3,}", r"(?i)[a-z]{3,}"])
def test_a_template_hole_cut_at_its_budget_asks_the_automaton_too(model_tok, pattern):
    # Python's `re` (the old judge of a hole's value) cannot read these: the values were valid=False
    model, tok = model_tok
    filled = hp.fill(model, tok, "P:\n", "Name: [a] end", a=hp.regex(pattern, max_tokens=6))
    detail = filled.details["a"]
    assert detail.tokens.generated == 7 and filled.text == f"Name: {filled.fields['a']} end"
    assert (detail.finish_reason, detail.valid) == ("length", True)
