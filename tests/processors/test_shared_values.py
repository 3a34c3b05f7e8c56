"""A grammar writes the plain JSON string once, as one rule, and calls it from every member value and item that is a
plain string (`translate.SHARED_VALUES`): the same documents as the flat regex, one rule text for every grammar."""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.processors.automaton import Grammar, build_automaton, call_regex
from hf_paged.processors.schema import schema_to_grammar, schema_to_regex
from hf_paged.processors.schema.strings import STRING

# open objects (undeclared keys allowed), so `schema_to_grammar` writes a grammar, not a flat regex
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string"},
        "alias": {"type": "string"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
        "id": {"type": "string", "pattern": "^[a-z]+$"},
        "n": {"type": "integer"},
        "either": {"type": ["string", "null"]},
    },
    "required": ["name"],
}
CLOSED = {**SCHEMA, "additionalProperties": False}  # the same members, no undeclared keys: a flat regex

DOCUMENTS = [
    ('{"name": "a"}', True),
    ('{"name": "", "alias": "caf\\u00e9 \\ud83d\\ude00 \\" \\\\ \\/ \\n"}', True),
    ('{"name": "x", "tags": ["a", "b\\tc", ""], "labels": {"k": "v", "k2": "w"}}', True),
    ('{"name": "x", "id": "abc", "n": -3, "either": null}', True),
    ('{"name": "x", "either": "s"}', True),
    ('{"name": "\u00e9\U0001f600"}', True),
    ('{"name": "x", "other": {"deep": [1, "s"]}}', True),
    ('{"alias": "a"}', False),  # name is required
    ('{"name": "\\ud83d"}', False),  # a lone surrogate half
    ('{"name": "a\\x"}', False),  # not an escape
    ('{"name": "a\x01"}', False),  # a raw control character
    ('{"name": "x", "tags": ["a", 1]}', False),
    ('{"name": "x", "labels": {"k": 2}}', False),
    ('{"name": "x", "id": "A"}', False),
]


def test_one_string_rule_called_from_every_plain_string_value():
    grammar = schema_to_grammar(SCHEMA)
    assert isinstance(grammar, Grammar)
    assert grammar.rules.count(STRING.text) == 1
    call = call_regex(grammar.rules.index(STRING.text) + 1)
    # name, alias, the array's items (twice: first and after a comma), the map's values (twice), either's string
    assert sum(text.count(call) for text in grammar.texts) >= 6
    assert all(STRING.text not in text for text in grammar.texts if text != STRING.text)  # nowhere in place


def test_the_shared_rule_keeps_the_documents_of_the_flat_regex():
    dfa = build_automaton(schema_to_grammar(SCHEMA))
    flat = re.compile(schema_to_regex(CLOSED))  # the closed twin: a plain regex with the strings in place
    for text, valid in DOCUMENTS:
        assert dfa.accepts(text.encode()) is valid, text
        if "other" not in text:  # (undeclared keys: the closed twin refuses them)
            assert (flat.fullmatch(text) is not None) is valid, text
        json.loads(text) if valid else None


def test_every_grammar_shares_the_same_rule_text():
    other = schema_to_grammar({"type": "array", "items": {"type": "object", "properties": {"s": {"type": "string"}}}})
    assert isinstance(other, Grammar) and STRING.text in other.rules


@pytest.mark.parametrize("names", [{"type": "string", "maxLength": 3}, {"type": "string"}])
def test_property_names_are_still_matched_as_text(names):
    # propertyNames translates a string schema that is matched with `re` (never a call): not shared
    grammar = schema_to_grammar({"type": "object", "properties": {"ab": {"type": "string"}, "abcd": {"type": "integer"}},
                                 "propertyNames": names, "required": ["ab"]})
    dfa = build_automaton(grammar)
    assert dfa.accepts(b'{"ab": "x"}')
    assert dfa.accepts(b'{"ab": "x", "abcd": 1}') is (names.get("maxLength") is None)
