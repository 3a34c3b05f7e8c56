"""Relaxed restrictions of the schema -> regex layer: undeclared keys in open objects, longer bounded strings
with short escapes, cheap strings in free values, and the budget fallbacks (every text accepted stays valid)."""

from __future__ import annotations

import json
import re
import time

import jsonschema
import pytest

from hf_paged.processors.automaton import anchored
from hf_paged.processors.schema import canonical_json, schema_to_regex


def accepts(schema, text: str, **kw) -> bool:
    return re.fullmatch(schema_to_regex(schema, **kw), text) is not None


OPEN = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string"}}, "required": ["a"]}


def test_undeclared_keys_by_default_declared_only_when_asked_for():
    assert accepts(OPEN, '{"a":1,"b":"x"}') and accepts(OPEN, '{"a":1,"c":true}')  # default: JSON Schema's reading
    assert not accepts(OPEN, '{"a":1,"c":true}', undeclared_keys=False)  # declared keys only
    explicit = dict(OPEN, additionalProperties=True)
    assert accepts(explicit, '{"a":1,"c":true}', undeclared_keys=False)  # an explicit keyword is always followed
    assert accepts({"type": "object"}, '{"c":1}')  # a map without declared names gets free keys


def test_open_object_takes_undeclared_keys_after_declared_ones():
    def open_accepts(text):
        return accepts(OPEN, text, undeclared_keys=True)

    assert open_accepts('{"a":1,"c":true}') and open_accepts('{"a":1,"b":"x","c":null,"d":{"e":1}}')
    assert open_accepts('{"a":1,"ab":2}') and open_accepts('{"a":1,"":2}')  # prefixes/extensions of names
    assert not open_accepts('{"c":true,"a":1}')  # extras come last
    assert not open_accepts('{"a":1,"a":"x"}') and not open_accepts('{"a":1,"b":"x","b":2}')  # never a declared name
    assert not open_accepts('{"a":1,"\\u0062":2}')  # nor an escaped spelling of one


def test_undeclared_keys_respect_closed_objects_and_max_properties():
    closed = dict(OPEN, additionalProperties=False)
    assert accepts(closed, '{"a":1}') and not accepts(closed, '{"a":1,"c":1}')
    capped = dict(OPEN, maxProperties=2)
    assert accepts(capped, '{"a":1,"c":1}', undeclared_keys=True)
    assert not accepts(capped, '{"a":1,"c":1,"d":2}', undeclared_keys=True)
    typed = dict(OPEN, additionalProperties={"type": "boolean"})
    assert accepts(typed, '{"a":1,"c":true}') and not accepts(typed, '{"a":1,"c":1}')


def test_keys_forbidden_by_not_required_are_never_written_as_extras():
    schema = {"type": "object", "not": {"required": ["x"]}}
    assert accepts(schema, '{"y":1}') and not accepts(schema, '{"x":1}') and not accepts(schema, '{"y":1,"x":2}')


def test_bounded_strings_go_past_32_characters_and_take_short_escapes():
    schema = {"type": "string", "maxLength": 100}
    assert accepts(schema, json.dumps("a" * 100)) and not accepts(schema, json.dumps("a" * 101))
    assert accepts(schema, '"line\\nbreak\\ttab"')  # \n and \t count one code point each
    assert accepts({"type": "string", "maxLength": 2}, '"\\n\\t"') and not accepts({"type": "string", "maxLength": 2}, '"\\n\\tx"')
    assert not accepts(schema, '"\\q"')  # not a JSON escape
    assert not accepts(schema, '"say \\"hi\\""')  # \" is left out of counted strings (index cost): a subset


def test_max_length_above_the_string_cap_is_narrowed_not_dropped():
    rx = schema_to_regex({"type": "string", "maxLength": 1000})
    assert re.fullmatch(rx, json.dumps("b" * 256)) and not re.fullmatch(rx, json.dumps("b" * 257))


def test_free_values_use_plain_strings():
    assert accepts({}, '{"k":"v\\"w"}') and accepts({}, '["a\\\\b"]')
    assert not accepts({}, '{"k":"\\u0041"}')  # \uXXXX left out of free values: a subset, still valid JSON
    assert accepts({"type": "string"}, '"\\u0041"')  # a declared string keeps every escape


def test_fallback_without_extras_keeps_schemas_that_only_fit_without_them():
    props = {f"p{i}": {"type": "object", "properties": {"q": {"type": "integer"}}} for i in range(12)}
    schema = {"type": "object", "properties": props}
    rx = schema_to_regex(schema, max_cost=60_000)
    doc = {"p0": {"q": 1}, "p5": {"q": 2}}
    assert re.fullmatch(rx, canonical_json(schema, doc))
    assert not re.fullmatch(rx, '{"p0":{"q":"x"}}')


@pytest.mark.parametrize(
    "schema, valid",
    [
        (OPEN, {"a": 1, "b": "x", "zz": [1, "y", None]}),
        ({"type": "object", "properties": {"s": {"type": "string", "maxLength": 40}}}, {"s": "x" * 40, "t": {}}),
    ],
)
def test_byte_dfa_agrees_with_re_and_accepts_valid_documents(schema, valid):
    from outlines_core import Index, Vocabulary

    rx = schema_to_regex(schema, undeclared_keys=True)
    start = time.thread_time()
    index = Index(anchored(rx), Vocabulary(256, {bytes([b]): [b] for b in range(256)}))
    assert time.thread_time() - start < 5.0
    text = canonical_json(schema, valid)
    jsonschema.validate(json.loads(text), schema)
    state = index.get_initial_state()
    for b in text.encode():
        state = index.get_next_state(state, b)
        assert state is not None
    assert index.is_final_state(state) and re.fullmatch(rx, text)
