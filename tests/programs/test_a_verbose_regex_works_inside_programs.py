"""A regex the stand-alone `RegexLogitsProcessor` takes works inside programs too: a verbose-mode pattern ending in
a `#` comment used to swallow the `)` of the group we wrap it in (InvalidRegexError on '(?:(?x) a b # comment)');
and when a pattern cannot be enforced where it stands (before a template's literal, between quotes) the error
quotes the user's pattern and names the hole, not our composed regex."""

from __future__ import annotations

import pytest

from hf_paged import RegexLogitsProcessor
from hf_paged import programs as hp
from hf_paged.errors import InvalidRegexError
from hf_paged.programs.hole_regex import group

VERBOSE = r"(?x) a b # comment"


def test_a_verbose_pattern_ending_in_a_comment_works_in_gen(model_tok):
    model, tok = model_tok
    RegexLogitsProcessor(VERBOSE, tok)  # stand-alone: fine

    @hp.program
    def field(s):
        s += "Q: " + hp.gen("x", regex=VERBOSE) + " then"

    state = field.run(model, tok)
    assert state["x"] == "ab" and state.text == "Q: ab then"
    assert (state.calls[0].finish_reason, state.calls[0].valid) == ("stop", True)


@pytest.mark.parametrize("mode", ["item_by_item", "one_shot"])
def test_a_verbose_pattern_works_as_a_template_hole(model_tok, mode):
    model, tok = model_tok
    filled = hp.fill(model, tok, "Data:\n", "A=[a] end", mode=mode, a=hp.regex(VERBOSE))
    assert filled.text == "A=ab end" and filled.fields == {"a": "ab"} and filled.valid


def test_the_group_closes_on_a_new_line_only_for_verbose_patterns(model_tok):
    model, tok = model_tok
    assert group("a#b") == "(?:a#b)" and group("[0-9]+") == "(?:[0-9]+)"
    assert group(VERBOSE) == "(?:" + VERBOSE + "(?x)\n)"
    filled = hp.fill(model, tok, "Data:\n", "A=[a] end", a=hp.regex(r"#[0-9]"))  # a literal '#', not verbose
    assert filled.text[:3] == "A=#" and filled.text[3].isdigit() and filled.text[4:] == " end"


def test_errors_quote_the_users_pattern_and_name_the_hole(model_tok):
    model, tok = model_tok
    filled = hp.fill(model, tok, "Data:\n", '{"a": "[a]"}', a=hp.regex(VERBOSE))  # a JSON string hole reads
    assert filled.valid  # the pattern as Rust does, verbose mode included (processors.schema.regex_string_body)
    with pytest.raises(InvalidRegexError) as caught:  # a word boundary before a word character: nowhere
        hp.fill(model, tok, "Data:\n", "A=[a]bar", a=hp.regex(r"foo(?-u:\b)"))
    message = str(caught.value)
    assert "hole [a]" in message and repr(r"foo(?-u:\b)") in message and "'bar'" in message
    assert "(?:foo" not in message
