"""The entry point: $ref, allOf/anyOf/oneOf, enum/const, errors, canonical_json, engine compatibility, soundness."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_paged.errors import (
    InvalidSchemaError,
    SchemaTooComplexError,
    UnsatisfiableSchemaError,
    UnsupportedSchemaError,
)
from hf_paged.processors.automaton import anchored
from hf_paged.processors.automaton.byte_dfa import build_byte_dfa
from hf_paged.processors.schema import canonical_json, schema_to_regex


def accepts(schema, text: str, **kw) -> bool:
    return re.fullmatch(schema_to_regex(schema, **kw), text) is not None


def test_boolean_schemas():
    assert accepts(True, '{"a":1}') and accepts(True, '[1,"x"]') and accepts(True, "null")
    # unconstrained values nest two levels when that fits a sixteenth of the budget, else one (any_depth)
    assert accepts(True, '{"a":[1]}') and not accepts(True, '{"a":[[1]]}')
    shallow = schema_to_regex(True, max_cost=32_000)
    assert re.fullmatch(shallow, '{"a":1}') and not re.fullmatch(shallow, '{"a":[1]}')
    with pytest.raises(UnsatisfiableSchemaError):
        schema_to_regex(False)


def test_refs_to_defs_and_definitions_and_recursion_is_cut_soundly():
    s = {"$defs": {"pos": {"type": "integer", "minimum": 1}}, "definitions": {"name": {"type": "string"}},
         "type": "object", "properties": {"n": {"$ref": "#/$defs/pos"}, "s": {"$ref": "#/definitions/name"}},
         "required": ["n"]}
    assert accepts(s, '{"n":3,"s":"x"}') and not accepts(s, '{"n":0}')
    tree = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"}}},
                               "additionalProperties": False}}, "$ref": "#/$defs/node"}
    rx = schema_to_regex(tree, max_ref_depth=2)
    assert re.fullmatch(rx, '{"kids":[{"kids":[]}]}') and not re.fullmatch(rx, '{"kids":[{"kids":[{}]}]}')


def test_bad_ref_is_an_invalid_schema():
    with pytest.raises(InvalidSchemaError, match="does not resolve"):
        schema_to_regex({"$ref": "#/$defs/missing"})


def test_all_of_is_an_intersection_not_a_concatenation():
    s = {"allOf": [{"type": "integer", "minimum": 2}, {"maximum": 4}]}
    assert [accepts(s, str(v)) for v in range(7)] == [False, False, True, True, True, False, False]
    objs = {"allOf": [{"properties": {"a": {"type": "string"}}, "required": ["a"]},
                      {"properties": {"b": {"type": "integer"}}, "required": ["b"]}]}
    assert accepts(objs, '{"a":"x","b":1}') and not accepts(objs, '{"a":"x"}')
    closed = {"allOf": [{"properties": {"a": {}}}, {"properties": {"b": {}}, "additionalProperties": False}]}
    assert not accepts(closed, '{"a":1}') and accepts(closed, '{"b":1}')  # "a" is additional for branch 2


def test_any_of_distributes_over_siblings():
    s = {"type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"],
         "anyOf": [{"properties": {"k": {"const": "x"}}}, {"properties": {"k": {"const": "y"}}}]}
    assert accepts(s, '{"k":"x"}') and accepts(s, '{"k":"y"}') and not accepts(s, '{"k":"z"}')


def test_one_of_narrowed_to_exclusive_branches_or_rejected():
    typed = {"oneOf": [{"type": "string"}, {"type": "integer"}]}
    assert accepts(typed, '"a"') and accepts(typed, "1")
    tagged = {"oneOf": [{"properties": {"t": {"const": "a"}, "x": {"type": "integer"}}},
                        {"properties": {"t": {"const": "b"}, "y": {"type": "string"}}}]}
    assert accepts(tagged, '{"t":"a","x":1}') and not accepts(tagged, "{}")  # tag made required: exactly one
    keyed = {"oneOf": [{"required": ["a"]}, {"required": ["b"]}]}
    assert accepts(keyed, '{"a":1}') and not accepts(keyed, '{"a":1,"b":2}')
    either = {"oneOf": [{"type": "integer"}, {"type": "number"}]}  # each where the other fails: the fractions
    assert accepts(either, "1.5") and not accepts(either, "1") and not accepts(either, '"a"')
    with pytest.raises(UnsupportedSchemaError, match=r"oneOf.*'#/oneOf'"):  # (no complement of a pattern)
        schema_to_regex({"oneOf": [{"type": "string", "pattern": "^a"}, {"type": "string", "pattern": "b$"}]})


def test_one_of_narrowing_rules_for_arrays_counts_and_finite_sides():
    nested = {"oneOf": [{"type": "array", "items": {"type": "number"}},
                        {"type": "array", "items": {"type": "array", "items": {"type": "number"}}}]}
    assert accepts(nested, "[1,2]") and accepts(nested, "[[1],[2]]")
    assert not accepts(nested, "[]")  # [] satisfies both branches: not exactly one
    counted = {"oneOf": [{"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}},
                          "required": ["a", "b"], "additionalProperties": False},
                         {"type": "object", "additionalProperties": {"const": False}, "maxProperties": 1}]}
    assert accepts(counted, '{"a":null,"b":null}') and accepts(counted, "{}")
    finite = {"oneOf": [{"type": "string", "pattern": "^[a-f0-9]{4}$"}, {"type": "string", "enum": ["", "zz"]}]}
    assert accepts(finite, '"ab12"') and accepts(finite, '""') and not accepts(finite, '"ab1"')
    hidden_tag = {"oneOf": [{"properties": {"t": {"allOf": [{"type": "string"}, {"enum": ["a"]}]}}, "required": ["t"]},
                            {"properties": {"t": {"allOf": [{"type": "string"}, {"enum": ["b"]}]}}, "required": ["t"]}]}
    assert accepts(hidden_tag, '{"t":"a"}') and accepts(hidden_tag, '{"t":"b"}')


def test_enum_and_const_are_filtered_by_siblings():
    s = {"type": "string", "enum": ["a", 1, "bb", None], "maxLength": 1}
    assert accepts(s, '"a"') and not accepts(s, "1") and not accepts(s, '"bb"') and not accepts(s, "null")
    assert accepts({"const": {"x": [1, 2]}}, '{"x":[1,2]}')
    with pytest.raises(UnsatisfiableSchemaError):
        schema_to_regex({"type": "integer", "enum": ["a"]})


def test_type_lists_and_nullable():
    s = {"type": ["string", "null"], "maxLength": 2}
    assert accepts(s, "null") and accepts(s, '"ab"') and not accepts(s, '"abc"') and not accepts(s, "0")


@pytest.mark.parametrize("keyword,schema", [
    ("if", {"if": {"pattern": "^a"}, "then": {"minLength": 2}}),  # (a pattern's complement: not written)
    ("not", {"type": "integer", "not": {"multipleOf": 3}}),
    ("$dynamicRef", {"$dynamicRef": "#x", "type": "string"}),
    ("maxContains", {"type": "array", "contains": {"type": "null"}, "maxContains": 1}),
])
def test_unsupported_keywords_name_keyword_and_pointer(keyword, schema):
    with pytest.raises(UnsupportedSchemaError, match=re.escape(f"`{keyword}` at '#/{keyword}'")):
        schema_to_regex(schema)
    with pytest.warns(UserWarning, match=re.escape(keyword)):
        schema_to_regex(schema, strict=False)


def test_nested_pointer_in_message():
    s = {"properties": {"a": {"type": "object", "properties": {"b": {"if": {"pattern": "x"}, "then": {}}}}}}
    with pytest.raises(UnsupportedSchemaError, match="#/properties/a/properties/b/if"):
        schema_to_regex(s)


def test_invalid_schemas():
    for bad in ([1], {"type": "strin"}, {"properties": 3}, {"minLength": -1, "type": "string"}):
        with pytest.raises(InvalidSchemaError):
            schema_to_regex(bad)


def test_unsatisfiable_and_too_complex():
    with pytest.raises(UnsatisfiableSchemaError):
        schema_to_regex({"type": "integer", "minimum": 5, "maximum": 4})
    with pytest.raises(SchemaTooComplexError, match="budget"):
        schema_to_regex({"type": "array", "items": {"type": "string", "minLength": 50}, "minItems": 40}, max_cost=10_000)
    with pytest.raises(SchemaTooComplexError, match="budget"):  # 40 x 300 counted characters at the default budget
        schema_to_regex({"type": "array", "items": {"type": "string", "minLength": 300}, "minItems": 40})


def test_many_optional_members_stay_within_the_engines_nesting_limit():
    # 100 optional members: one group per member would nest past outlines-core's parser limit (~250 groups)
    names = [f"k{i}" for i in range(100)]
    rx = schema_to_regex({"type": "object", "properties": {n: {"type": "integer"} for n in names}})
    build_byte_dfa(anchored(rx))  # raises ValueError("... error building NFA") on the one-group-per-member form
    for keys in ([], [0], [99], [0, 99], [3, 4, 50, 98], list(range(0, 100, 7))):
        assert re.fullmatch(rx, "{" + ",".join(f'"k{i}":{i}' for i in keys) + "}")
    for keys in ([99, 0], [4, 3], [5, 5], [10, 50, 20]):  # out of schema order, or repeated
        assert not re.fullmatch(rx, "{" + ",".join(f'"k{i}":{i}' for i in keys) + "}")
    assert not re.fullmatch(rx, '{,"k1":1}') and not re.fullmatch(rx, '{"k1":1,}')


def test_shrunk_translations_narrow_counted_strings_first():
    schema = {"type": "string", "maxLength": 10}
    exact = schema_to_regex(schema)
    assert re.fullmatch(exact, '"caf\u00e9 \u6f22"')
    # over the budget: the first shrunk try spells counted strings below U+0800 only, lengths still exact
    with pytest.warns(UserWarning, match="below U\\+0800"):
        narrow = schema_to_regex(schema, max_cost=200)
    assert re.fullmatch(narrow, '"caf\u00e9 \u0416\\n"')  # two-byte UTF-8 and a short escape
    assert not re.fullmatch(narrow, '"\u6f22"')  # three-byte UTF-8
    assert re.fullmatch(narrow, '"' + "x" * 10 + '"') and not re.fullmatch(narrow, '"' + "x" * 11 + '"')


def test_canonical_json_picks_the_branch_that_declares_the_instances_keys():
    # jsonschema finds the first branch valid (it allows undeclared keys), but its regex gives only declared ones
    base = {"type": "object", "properties": {"content": {"type": "string"}}, "required": ["content"]}
    active = {"oneOf": [{"$ref": "#/$defs/base"}], "type": "object",
              "properties": {"config": {"type": "boolean"}}, "required": ["config"]}
    s = {"$defs": {"base": base}, "anyOf": [{"$ref": "#/$defs/base"}, active]}
    text = canonical_json(s, {"content": "x", "config": True})
    assert text == '{"config":true,"content":"x"}' and re.fullmatch(schema_to_regex(s), text)
    assert canonical_json(s, {"content": "x"}) == '{"content":"x"}'
    # a branch that names every key comes before one that is merely open (its regex puts extras last)
    anything = {"type": "object", "properties": {"meta": {"type": "object"}}}
    named = {"type": "object", "properties": {"meta": {"type": "object"}, "info": {"type": "string"},
                                              "version": {"type": "string"}}}
    s2 = {"anyOf": [dict(anything, additionalProperties={}), named]}
    assert canonical_json(s2, {"version": "1", "info": "x"}) == '{"info":"x","version":"1"}'


def test_canonical_json_follows_the_regex_spelling():
    s = {"type": "object", "properties": {"b": {"type": "number"}, "a": {"type": "string"}}}
    text = canonical_json(s, {"a": "x", "b": 2.50})
    assert text == '{"b":2.5,"a":"x"}'
    assert canonical_json({"type": "object"}, {"z": 1.0, "y": [True]}) == '{"z":1,"y":[true]}'
    assert re.fullmatch(schema_to_regex(s), text)
    assert canonical_json(True, float("nan")) is None


def test_regexes_compile_with_outlines_core_on_a_byte_vocabulary():
    oc = pytest.importorskip("outlines_core")
    vocab = oc.Vocabulary(256, {bytes([b]): [b] for b in range(256)})
    for schema in ({"type": "object", "properties": {"a": {"type": "string", "pattern": "^a|b$", "maxLength": 4},
                                                     "n": {"type": "number", "exclusiveMaximum": 1.5}}},
                   {"type": "string", "format": "email"}, {"enum": ["x", 1, None]}, True):
        index = oc.Index(schema_to_regex(schema), vocab)
        assert index.get_initial_state() is not None


_SCHEMAS = [
    {"type": "object", "properties": {"a": {"type": "integer", "minimum": -3, "maximum": 7}, "b": {"type": "string",
     "maxLength": 2}}, "required": ["a"]},
    {"type": "array", "items": {"type": "number", "exclusiveMinimum": 0, "maximum": 2.5}, "maxItems": 3},
    {"anyOf": [{"type": "string", "pattern": "^[ab]+$"}, {"type": "boolean"}, {"const": None}]},
    {"type": "object", "additionalProperties": {"type": "integer", "multipleOf": 2}, "maxProperties": 2},
]
_JSON = st.recursive(
    st.none() | st.booleans() | st.integers(-20, 20) | st.floats(-5, 5, allow_nan=False) | st.text("ab\"\\é", max_size=3),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
    max_leaves=6,
)


@settings(max_examples=150, deadline=None)
@given(st.sampled_from(range(len(_SCHEMAS))), _JSON)
def test_soundness_every_accepted_text_validates(i, value):
    schema = _SCHEMAS[i]
    text = canonical_json(schema, value)
    if text is not None and re.fullmatch(schema_to_regex(schema), text):
        jsonschema.validate(json.loads(text), schema)


def test_translation_work_budget():
    from hf_paged.processors.budget import CompileBudget

    with pytest.raises(SchemaTooComplexError, match="max_visits"):
        schema_to_regex({"type": "object", "properties": {"a": {"type": "string"}}}, budget=CompileBudget(max_visits=1))


def test_nested_id_resources_keep_their_anchors_and_refuse_scoped_references():
    # `#A` from the root means the root's anchor, not the one inside the sub-resource with its own $id
    s = {"$ref": "#A", "$defs": {"root_a": {"$anchor": "A", "type": "integer"},
                                 "other": {"$id": "http://x/other", "$defs": {"a": {"$anchor": "A", "type": "string"}}}}}
    assert accepts(s, "1") and not accepts(s, '"x"')
    # a nested $id with no reference inside changes nothing; one with references inside is refused
    harmless = {"type": "object", "properties": {"v": {"$id": "http://x/v", "type": "integer"}}, "required": ["v"]}
    assert accepts(harmless, '{"v":1}')
    scoped = {"properties": {"v": {"$id": "http://x/v", "$ref": "#/$defs/t", "$defs": {"t": {"type": "string"}}}},
              "$defs": {"t": {"type": "integer"}}}
    with pytest.raises(UnsupportedSchemaError, match=r"\$id"):
        schema_to_regex(scoped)


def test_one_of_narrowing_uses_the_schema_draft_and_prefix_items():
    # draft-04: exclusiveMinimum false keeps 0 valid, so 0 satisfies both branches and must not be produced
    draft4 = {"$schema": "http://json-schema.org/draft-04/schema#",
              "oneOf": [{"type": "number", "minimum": 0, "exclusiveMinimum": False}, {"enum": [0]}]}
    try:
        assert not accepts(draft4, "0")
    except UnsupportedSchemaError:
        pass
    # `items` after `prefixItems` does not see the first item: ["x"] satisfies both branches
    tuple_first = {"oneOf": [{"type": "array", "prefixItems": [{"type": "string"}], "items": {"type": "number"}},
                             {"type": "array", "items": {"type": "string"}}]}
    try:
        assert not accepts(tuple_first, '["x"]')
    except UnsupportedSchemaError:
        pass
