"""A hole's value is matched whole, so anchors at its pattern's ends mean the value's ends, as a leading `^` already
did item by item: `fill("A=[a] end", a=hp.regex(r"abc$"))` was 'matches no text' ('(?:abc$) end'), `abc\\z` was
InvalidRegexError, and `^` worked only where the hole started the generation (not a later hole of a one-shot
template). Leading `^`/`\\A` and closing `$`/`\\z` of each top-level alternative are dropped; an anchor left
inside the pattern would hold only at the ends of the whole generation (silently losing alternatives), so a
template refuses it with a TemplateError that names the hole and the anchor. A plain `gen`'s regex is the whole
generation: anchors inside it keep their meaning there."""

from __future__ import annotations

import pytest

from hf_paged import programs as hp
from hf_paged.programs.errors import TemplateError
from hf_paged.programs.hole_regex import inner_anchors, strip_end_anchors


@pytest.mark.parametrize("mode", ["item_by_item", "one_shot"])
@pytest.mark.parametrize("pattern", [r"abc$", r"abc\z", r"^abc", r"\Aabc\z", r"(?i)^abc$", r"^abc$|^xyz$"])
def test_anchors_at_the_ends_mean_the_holes_ends(model_tok, mode, pattern):
    model, tok = model_tok
    filled = hp.fill(model, tok, "Data:\n", "A=[a] end", mode=mode, a=hp.regex(pattern))
    assert filled.text.lower() in ("a=abc end", "a=xyz end") and filled.valid


def test_a_later_hole_of_a_one_shot_template_takes_a_start_anchor(model_tok):
    model, tok = model_tok
    filled = hp.fill(model, tok, "Data:\n", "A=[a] B=[b]!", mode="one_shot", a=hp.regex(r"[0-9]"),
                     b=hp.regex(r"^x[0-9]$"))
    assert filled.mode == "one_shot" and filled.valid
    assert filled.fields["b"][0] == "x" and filled.text == f"A={filled.fields['a']} B={filled.fields['b']}!"


def test_a_json_string_hole_takes_end_anchors(model_tok):
    model, tok = model_tok
    filled = hp.fill(model, tok, "Data:\n", '{"a": "[a]"}', a=hp.regex(r"^abc$"))
    assert filled.text == '{"a": "abc"}'


@pytest.mark.parametrize("pattern, anchor", [(r"(abc$)", "'$'"), (r"a|(b\z)c?", "'\\\\z'"), (r"(?:^a|b)c", "'^'")])
def test_an_anchor_inside_a_hole_pattern_is_refused(model_tok, pattern, anchor):
    model, tok = model_tok
    with pytest.raises(TemplateError) as caught:
        hp.fill(model, tok, "Data:\n", "A=[a] end", a=hp.regex(pattern))
    assert "hole [a]" in str(caught.value) and anchor in str(caught.value) and repr(pattern) in str(caught.value)


def test_a_gen_regex_keeps_its_inner_anchors(model_tok):
    model, tok = model_tok

    @hp.program
    def field(s):
        s += "Q: " + hp.gen("x", regex=r"(abc$)") + " then"

    state = field.run(model, tok)
    assert state["x"] == "abc" and state.calls[0].valid


def test_what_counts_as_an_anchor_at_an_end():
    assert strip_end_anchors(r"a\$") == r"a\$"  # an escaped dollar is a literal
    assert strip_end_anchors(r"a\\$") == r"a\\"  # an escaped backslash, then the anchor
    assert strip_end_anchors(r"[$^]") == r"[$^]" and strip_end_anchors(r"[^a]$") == r"[^a]"
    assert strip_end_anchors(r"[a-z&&[^aeiou]]$") == r"[a-z&&[^aeiou]]"  # a nested class
    assert strip_end_anchors("(?x) a b $ # ends here") == "(?x) a b  # ends here"
    assert strip_end_anchors("(?x) a # not $ an anchor\n b") == "(?x) a # not $ an anchor\n b"
    assert strip_end_anchors(r"^*a") == r"^*a" and inner_anchors(r"^*a") == [("^", 0)]  # under a repetition
    assert strip_end_anchors(r"a$?") == r"a$?"
    assert strip_end_anchors(r"\p{Greek}$") == r"\p{Greek}" and strip_end_anchors(r"a{2}\z") == "a{2}"
    assert strip_end_anchors("(?m)^a$\n^b$") == "(?m)a$\n^b"
    assert inner_anchors("(?m)a$\n^b") == []  # multi-line anchors look at the text on both sides: kept
    assert inner_anchors(r"(?i:^a)b") == [("^", 4)] and inner_anchors(r"(?P<n>a)") == []
