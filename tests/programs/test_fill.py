"""`hp.fill`: templates compiled to literals and holes, both modes valid, per-field retries from the cached prefix,
and bad templates or constraints refused with errors that name the hole."""

from __future__ import annotations

import json

import pytest

from hf_paged import programs as hp

TEMPLATE = '{"intent": "[intent]", "response": "[response]", "suggestions": ["[s1]", "[s2]"]}'
PROMPT = "A support ticket: my card was charged twice.\n"


def _holes(**overrides):
    holes = {"intent": ["billing", "complaint", "other"], "response": hp.text(max_tokens=16),
             "s1": hp.text(max_tokens=8), "s2": hp.text(max_tokens=8)}
    holes.update(overrides)
    return holes


@pytest.mark.parametrize("mode", ["item_by_item", "one_shot"])
def test_fill_gives_valid_json_with_every_field(model_tok, mode):
    model, tok = model_tok
    filled = hp.fill(model, tok, PROMPT, TEMPLATE, mode=mode, **_holes())
    doc = json.loads(filled.text)  # text holes are JSON string bodies: never an unescaped quote
    assert doc == {"intent": filled.fields["intent"], "response": filled.fields["response"],
                   "suggestions": [filled.fields["s1"], filled.fields["s2"]]}
    assert filled.fields["intent"] in ("billing", "complaint", "other")
    assert set(filled.details) == {"intent", "response", "s1", "s2"} and filled.mode == mode
    assert all(filled.attempts[name] == 1 for name in filled.details)
    assert set(filled.finish_reasons.values()) <= {"stop", "length", "scored"}
    tokens = filled.tokens
    assert tokens.requests == (1 if mode == "one_shot" else 3 + 3) and tokens.generated > 0
    if mode == "one_shot":  # (item by item, this random model never closes a text field within its tokens)
        assert tokens.forced > 0  # the literals after the holes came from jump-forward


def test_item_by_item_reuses_the_cached_prefix_for_every_field(model_tok):
    model, tok = model_tok
    filled = hp.fill(model, tok, PROMPT * 4, TEMPLATE, **_holes())
    later = [filled.details[name].tokens for name in ("response", "s1", "s2")]
    assert all(t.cached >= t.prompt - 8 - 20 for t in later)  # only the last partial block and new text computed


def test_a_refused_field_is_regenerated_alone_with_a_new_seed(model_tok):
    model, tok = model_tok
    seen = []

    def second_time_lucky(value):
        seen.append(value)
        return len(seen) >= 2

    holes = _holes(response=hp.text(max_tokens=6, validator=second_time_lucky, max_retries=3))
    filled = hp.fill(model, tok, PROMPT, TEMPLATE, **holes)
    response = filled.details["response"]
    assert [a.valid for a in response.attempts] == [False, True] and response.valid and filled.valid
    assert response.attempts[0].seed is None and response.attempts[1].seed == 1  # greedy first, then sampled
    assert response.tokens.requests == 2
    assert filled.details["s1"].attempts[0].valid and len(filled.details["s1"].attempts) == 1
    json.loads(filled.text)


def test_one_shot_goes_on_item_by_item_from_a_refused_field(model_tok):
    model, tok = model_tok
    calls = []

    def refuse_first(value):
        calls.append(value)
        return len(calls) > 1

    holes = _holes(s1=hp.text(max_tokens=8, validator=refuse_first, max_retries=2))
    filled = hp.fill(model, tok, PROMPT, TEMPLATE, mode="one_shot", **holes)
    s1 = filled.details["s1"]
    assert len(s1.attempts) == 2 and not s1.attempts[0].valid and s1.attempts[1].valid
    assert filled.details["intent"].attempts[0].valid
    json.loads(filled.text)


def test_fields_with_regex_and_schema_constraints(model_tok):
    model, tok = model_tok
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 0, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    for mode in ("item_by_item", "one_shot"):
        filled = hp.fill(model, tok, "Order:\n", "code=[code] data=[data];", mode=mode,
                         code=hp.regex(r"[A-Z]{2}[0-9]", max_tokens=4), data=hp.schema(schema, max_tokens=16))
        assert len(filled.fields["code"]) == 3 and filled.fields["code"][:2].isupper()
        assert 0 <= filled.fields["data"]["n"] <= 9
        assert filled.text == f"code={filled.details['code'].text} data={filled.details['data'].text};"


def test_a_regex_hole_between_quotes_is_an_escaped_string_body(model_tok):
    """A regex that can emit a quote was inserted raw: '{"a": "a""}' did not parse. Now the value matches the
    pattern and the text is its JSON string body; schema and grammar holes there are refused (their text is no
    string body)."""
    model, tok = model_tok
    for mode in ("item_by_item", "one_shot"):
        filled = hp.fill(model, tok, "Name:", '{"a": "[a]"}', mode=mode, a=hp.regex('[a-z]"', max_tokens=6))
        assert json.loads(filled.text) == {"a": filled.fields["a"]} and filled.fields["a"].endswith('"')
    for hole, words in ((hp.schema({"type": "string", "maxLength": 3}), "hp.schema writes a whole JSON value"),
                        (hp.grammar('start: "x"'), "not escaped as a JSON string")):
        with pytest.raises(hp.TemplateError, match=f"hole \\[a\\] sits between quotes .*{words}"):
            hp.fill(model, tok, "p", '{"a": "[a]"}', a=hole)


@pytest.mark.parametrize("template,holes,match", [
    ('{"a": "[a"}', {"a": ["x"]}, "unbalanced hole.*'\\[a' has no closing"),
    ('{"a": "a]"}', {}, "unbalanced hole.*'a\\]' has no opening"),
    ('[a] and [a]', {"a": ["x"]}, "hole \\[a\\] appears twice"),
    ('[a] and [b]', {"a": ["x"]}, "hole \\[b\\] has no constraint"),
    ('[a]', {"a": ["x"], "zzz": ["y"]}, "no such hole"),
    ('no holes here', {}, "no hole"),
])
def test_bad_templates_raise_template_errors(model_tok, template, holes, match):
    model, tok = model_tok
    with pytest.raises(hp.TemplateError, match=match):
        hp.fill(model, tok, "p", template, **holes)


def test_bad_constraints_and_modes(model_tok):
    model, tok = model_tok
    with pytest.raises(hp.FieldConstraintError, match="hole \\[a\\].*not a constraint"):
        hp.fill(model, tok, "p", "[a]", a=42)
    with pytest.raises(hp.FieldConstraintError, match="non-empty list"):
        hp.fill(model, tok, "p", "[a]", a=[])
    with pytest.raises(ValueError, match="mode must be one of"):
        hp.fill(model, tok, "p", "[a]", mode="fast", a=["x"])
    with pytest.raises(hp.FieldConstraintError, match="temperature"):
        hp.fill(model, tok, "p", "[a]", temperature=-1, a=["x"])
    with pytest.raises(hp.FieldConstraintError, match="top_p"):
        hp.gen("x", top_p=0)
    with pytest.raises(hp.FieldConstraintError, match="max_tokens"):
        hp.text(max_tokens=-1)
    with pytest.raises(hp.FieldConstraintError, match="callable"):
        hp.text(validator="yes", max_retries=1)
    recursive = 'start: "(" start ")" | "x"'
    with pytest.raises(hp.TemplateError, match="one_shot.*item_by_item"):
        hp.fill(model, tok, "p", "e=[e];", mode="one_shot", e=hp.grammar(recursive))
    filled = hp.fill(model, tok, "p", "e=[e];", e=hp.grammar(recursive, max_tokens=12))  # item by item works
    assert filled.text.startswith("e=") and filled.text.endswith(";")


def test_a_validator_that_raises_names_the_field(model_tok):
    model, tok = model_tok

    def broken(value):
        return value.missing_attribute

    with pytest.raises(hp.ValidatorError, match="field 's1'.*AttributeError"):
        hp.fill(model, tok, PROMPT, TEMPLATE, **_holes(s1=hp.text(max_tokens=4, validator=broken, max_retries=1)))


def test_a_field_cut_inside_its_literal_keeps_the_literal_once():
    from hf_paged.programs.calls import GenCall
    from hf_paged.programs.steps import _before_partial_suffix

    choice = GenCall("p", 4, suffix='", "next": "', regex="(?:low|medium)")
    assert _before_partial_suffix(choice, 'medium", "ne') == "medium"
    text = GenCall("t", 4, suffix='", "next": "', json_string=True, regex='[^"]*')
    assert _before_partial_suffix(text, 'some words"') == "some words"
    assert _before_partial_suffix(text, "no literal yet") == "no literal yet"


def test_parallel_fields_run_as_forks_of_the_text_before_them(model_tok):
    model, tok = model_tok
    one_by_one = hp.fill(model, tok, PROMPT, TEMPLATE, **_holes())
    together = hp.fill(model, tok, PROMPT, TEMPLATE, parallel=[["s1", "s2"]], **_holes())
    json.loads(together.text)
    assert together.fields["s1"] == one_by_one.fields["s1"]  # the same text before it
    assert together.fields["s2"] == together.fields["s1"]  # s2 saw the text before s1, not s1 (greedy, same hole)
    assert together.text.startswith(one_by_one.text[: one_by_one.text.index('"suggestions"')])
    with pytest.raises(hp.TemplateError, match="follow each other"):
        hp.fill(model, tok, PROMPT, TEMPLATE, parallel=[["intent", "s2"]], **_holes())
    with pytest.raises(hp.TemplateError, match="item_by_item"):
        hp.fill(model, tok, PROMPT, TEMPLATE, mode="one_shot", parallel=[["s1", "s2"]], **_holes())
    with pytest.raises(hp.TemplateError, match="unknown"):
        hp.fill(model, tok, PROMPT, TEMPLATE, parallel=[["s1", "s9"]], **_holes())


def test_an_instruction_is_seen_by_its_field_only(model_tok):
    model, tok = model_tok
    instruction = "The response: one short sentence, polite."
    plain = hp.fill(model, tok, PROMPT, TEMPLATE, **_holes())
    told = hp.fill(model, tok, PROMPT, TEMPLATE, **_holes(response=hp.text(max_tokens=16, instruction=instruction)))
    json.loads(told.text)
    assert instruction not in told.text and told.fields["intent"] == plain.fields["intent"]
    response = told.details["response"].tokens
    assert response.prompt == plain.details["response"].tokens.prompt + len(instruction) + 1  # bytes, and "\n"
    assert response.cached >= len(PROMPT) // 8 * 8 - 8  # the prompt's blocks are shared with the record's calls
    with pytest.raises(hp.TemplateError, match="instruction.*item_by_item"):
        hp.fill(model, tok, PROMPT, TEMPLATE, mode="one_shot",
                **_holes(response=hp.text(max_tokens=16, instruction=instruction)))
    with pytest.raises(hp.FieldConstraintError, match="instruction"):
        hp.text(instruction="  ")


def test_a_json_string_regex_hole_reads_rust_syntax(model_tok):
    """h4 P10: the hole between quotes read its regex as a schema `pattern` (Python's `re`): 'a]]]' for this class
    intersection (outside quotes, Rust's consonants)."""
    from hf_paged.processors.automaton.byte_dfa import anchored, build_byte_dfa

    model, tok = model_tok
    rust = build_byte_dfa(anchored(r"[a-z&&[^aeiou]]{3}"))
    for mode in ("item_by_item", "one_shot"):
        filled = hp.fill(model, tok, "Data:\n", '{"a": "[a]"}', mode=mode, a=hp.regex(r"[a-z&&[^aeiou]]{3}"))
        value = json.loads(filled.text)["a"]
        assert value == filled.fields["a"] and rust.accepts(value.encode()), value
