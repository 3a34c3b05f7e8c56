"""Objects and arrays: order, required, additional keys, counts, dependencies, uniqueness."""

from __future__ import annotations

import re

import pytest

from hf_paged.errors import UnsatisfiableSchemaError, UnsupportedSchemaError
from hf_paged.processors.schema import schema_to_regex


def accepts(schema, text: str, **kw) -> bool:
    return re.fullmatch(schema_to_regex(schema, **kw), text) is not None


def test_properties_in_schema_order_optional_may_be_omitted():
    s = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["b"]}
    assert accepts(s, '{"a":1,"b":true}') and accepts(s, '{"b":false}') and accepts(s, '{ "b": true }')
    assert not accepts(s, '{"a":1}') and not accepts(s, '{"b":true,"a":1}') and not accepts(s, '{"a":1,"a":2,"b":true}')
    assert accepts(s, '{"b":true,"c":1}')  # undeclared keys, as JSON Schema allows (the default)...
    assert not accepts(s, '{"b":true,"c":1}', undeclared_keys=False)  # ... or declared keys only when asked for
    assert accepts(s, '{"a":1,"b":true,"c":{"d":1},"e":"x"}')  # undeclared keys last
    assert accepts({"type": "object"}, '{"c":1}')  # a map without declared names gets free keys
    closed = dict(s, additionalProperties=False)
    assert not accepts(closed, '{"b":true,"c":1}') and accepts(closed, '{"b":true}')


def test_whitespace_is_bounded_and_configurable():
    s = {"type": "object", "properties": {"a": {"type": "null"}}, "required": ["a"]}
    assert not accepts(s, '{  "a":null}')
    assert accepts(s, '{\n  "a": null\n}', whitespace="[ \\n]{0,3}")


def test_empty_subschema_in_properties_keeps_the_object_valid():
    s = {"type": "object", "properties": {"x": {}, "y": {"type": "string"}}, "required": ["x", "y"]}
    assert accepts(s, '{"x":[1,"a"],"y":"s"}') and accepts(s, '{"x":null,"y":""}')
    assert not accepts(s, '{"x":,"y":"s"}')


def test_required_name_missing_from_properties_is_still_required():
    s = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"], "additionalProperties": False}
    with pytest.raises(UnsatisfiableSchemaError):
        schema_to_regex(s)
    s2 = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["b"]}
    assert accepts(s2, '{"b":1}') and not accepts(s2, '{"a":1}')


def test_additional_properties_schema_and_reserved_names():
    s = {"type": "object", "properties": {"id": {"type": "integer"}}, "additionalProperties": {"type": "string"}}
    assert accepts(s, '{"id":1,"x":"y","z":"w"}') and accepts(s, '{"k":"v"}')
    assert not accepts(s, '{"id":1,"x":2}') and not accepts(s, '{"x":"y","id":"nope"}')
    assert not accepts(s, '{"id":1,"id":"dup"}')  # an extra key never spells a declared name


def test_min_and_max_properties():
    s = {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"}},
         "minProperties": 1, "maxProperties": 2}
    assert not accepts(s, "{}") and accepts(s, '{"b":null}') and accepts(s, '{"a":null,"c":null}')
    assert not accepts(s, '{"a":null,"b":null,"c":null}')


def test_dependent_required():
    s = {"type": "object", "properties": {"card": {"type": "string"}, "cvv": {"type": "string"}},
         "dependentRequired": {"card": ["cvv"]}}
    assert accepts(s, '{"card":"1","cvv":"2"}') and accepts(s, '{"cvv":"2"}') and accepts(s, "{}")
    assert not accepts(s, '{"card":"1"}')


def test_pattern_properties_constrain_declared_names_and_map_keys():
    s = {"type": "object", "properties": {"n_a": {}}, "patternProperties": {"^n_": {"type": "integer"}}}
    assert accepts(s, '{"n_a":3}') and not accepts(s, '{"n_a":"x"}')
    m = {"type": "object", "patternProperties": {"^x-[a-z]+$": {"type": "boolean"}}, "additionalProperties": False}
    assert accepts(m, '{"x-ab":true,"x-c":false}') and not accepts(m, '{"y":true}') and not accepts(m, '{"x-a":1}')


def test_not_required_keeps_one_name_out():
    s = {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}}, "not": {"required": ["a"]}}
    assert accepts(s, '{"b":null}') and not accepts(s, '{"a":null}')


def test_arrays_items_counts_and_tuples():
    s = {"type": "array", "items": {"type": "integer"}, "minItems": 1, "maxItems": 3}
    assert [accepts(s, t) for t in ("[]", "[1]", "[1, 2,3]", "[1,2,3,4]", '[1,"a"]')] == [False, True, True, False, False]
    t = {"type": "array", "prefixItems": [{"type": "string"}, {"type": "integer"}], "items": False}
    assert accepts(t, '["a",1]') and accepts(t, '["a"]') and accepts(t, "[]") and not accepts(t, '["a",1,2]')
    legacy = {"type": "array", "items": [{"type": "string"}], "additionalItems": {"type": "null"}}
    assert accepts(legacy, '["a",null,null]') and not accepts(legacy, '[null]')


def test_contains_puts_the_match_first():
    s = {"type": "array", "items": {"type": "integer"}, "contains": {"minimum": 10}}
    assert accepts(s, "[10,1]") and not accepts(s, "[]") and not accepts(s, "[1,2]")


def test_unique_items_over_a_finite_set_and_rejection_otherwise():
    s = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True}
    assert accepts(s, '["a","c"]') and accepts(s, "[]") and not accepts(s, '["a","a"]')
    assert accepts({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True}, "[false,true]")
    free = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
    with pytest.warns(UserWarning, match="left out"):  # items a regex cannot compare: at most one of them
        rx = schema_to_regex(free)
    assert re.fullmatch(rx, '["x"]') and re.fullmatch(rx, "[]") and not re.fullmatch(rx, '["x","y"]')
    with pytest.raises(UnsupportedSchemaError, match=r"uniqueItems.*#/uniqueItems"):
        schema_to_regex({**free, "minItems": 2})
    assert accepts({"type": "array", "items": {"type": "string"}, "uniqueItems": True, "maxItems": 1}, '["x"]')


def test_unique_items_over_a_finite_set_keep_min_items():
    """The uniqueness path ended every array at any count: `[]` and `[1]` passed `minItems: 2` (invalid output)."""
    s = {"type": "array", "items": {"enum": [1, 2, 3]}, "uniqueItems": True, "minItems": 2}
    assert not accepts(s, "[]") and not accepts(s, "[1]") and accepts(s, "[1,3]") and accepts(s, "[1,2,3]")  # (in the enum's order)
    exact = {"type": "array", "items": {"enum": ["a", "b", "c"]}, "uniqueItems": True, "minItems": 3, "maxItems": 3}
    assert not accepts(exact, '["c"]') and accepts(exact, '["a","b","c"]')
    one = {"type": "array", "items": {"const": 1}, "uniqueItems": True, "minItems": 1}
    assert not accepts(one, "[]") and accepts(one, "[1]") and not accepts(one, "[1,1]")
    assert not accepts({"type": "array", "items": {"type": "boolean"}, "uniqueItems": True, "minItems": 2}, "[true]")


def test_optional_members_are_left_out_when_over_budget():
    s = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 30} for i in range(12)},
         "required": ["p0"]}
    with pytest.warns(UserWarning, match="left out"):
        rx = schema_to_regex(s, max_cost=3000)
    assert re.fullmatch(rx, '{"p0":"x"}') and not re.fullmatch(rx, '{"p1":"x"}')


def test_all_optional_members_any_subset_in_order_with_linear_regex():
    names = [f"k{i}" for i in range(6)]
    s = {"type": "object", "properties": {n: {"type": "integer"} for n in names}, "additionalProperties": False}
    rx = re.compile(schema_to_regex(s))
    for mask in range(64):
        chosen = [n for i, n in enumerate(names) if mask >> i & 1]
        text = "{" + ",".join(f'"{n}":{i}' for i, n in enumerate(chosen)) + "}"
        assert rx.fullmatch(text), text
    assert not rx.fullmatch('{"k1":1,"k0":0}') and not rx.fullmatch('{,"k0":0}') and not rx.fullmatch('{"k0":0,}')
    assert not rx.fullmatch('{"k0":0,"k0":0}')
    # each member is written at most twice (first or after a comma), three times in lists long enough to be
    # split into blocks (nesting limit): the regex grows linearly, not quadratically
    small = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(20)}}
    assert schema_to_regex(small).count('"p10"') == 2
    big = {"type": "object", "properties": {f"p{i}": {"type": "integer"} for i in range(80)}}
    assert schema_to_regex(big).count('"p40"') == 3


def test_optional_members_before_a_required_one_keep_the_schema_order():
    s = {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}, "c": {"type": "null"},
                                          "r": {"type": "null"}, "d": {"type": "null"}}, "required": ["r"]}
    assert accepts(s, '{"a":null,"c":null,"r":null,"d":null}') and accepts(s, '{"r":null}')
    assert accepts(s, '{"b":null,"r":null}') and not accepts(s, '{"r":null,"a":null}')
    assert not accepts(s, '{"a":null}') and not accepts(s, '{"a":null,"r":null,}')


def test_counted_repetitions_are_capped_before_members_are_left_out():
    item = {"type": "object", "properties": {f"p{i}": {"type": "string", "maxLength": 200} for i in range(4)}}
    s = {"type": "object", "properties": {"xs": {"type": "array", "items": item, "maxItems": 64},
                                          "tag": {"type": "string", "maxLength": 8}}}
    with pytest.warns(UserWarning, match="counted repetitions capped"):
        rx = schema_to_regex(s, max_cost=40_000)
    assert re.fullmatch(rx, '{"xs":[{"p0":"a","p3":"b"},{"p1":"c"}],"tag":"t"}')  # every member kept
    assert not re.fullmatch(rx, '{"xs":[' + ",".join(['{"p0":"a"}'] * 33) + "]}")  # but fewer items


def test_undeclared_keys_count_toward_min_properties_once():
    # a map with minProperties was reported unsatisfiable: only declared members counted toward the minimum
    m = {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}
    assert accepts(m, '{"v1.0":"first","v2.0":"second"}') and not accepts(m, "{}") and not accepts(m, '{"a":1}')
    # two undeclared keys may be one key (JSON keeps the last): {"x":1,"x":2} has one property, so extras count
    # toward minProperties once at most
    s = {"type": "object", "properties": {"a": {"type": "null"}}, "minProperties": 2, "maxProperties": 3,
         "additionalProperties": {"type": "integer"}}
    for text, ok in [("{}", False), ('{"a":null}', False), ('{"x":1}', False), ('{"a":null,"x":1}', True),
                     ('{"x":1,"y":2}', False), ('{"x":1,"x":2}', False), ('{"a":null,"x":1,"y":2}', True),
                     ('{"a":null,"x":1,"y":2,"z":3}', False)]:
        assert accepts(s, text) is ok, text
    # soundly refused rather than counting duplicate keys, as unsupported (it named no keyword as "unsatisfiable")
    with pytest.raises(UnsupportedSchemaError, match=r"minProperties.*at most 1 property is assured"):
        schema_to_regex({"type": "object", "minProperties": 2, "additionalProperties": {"type": "string"}})


def test_undeclared_keys_are_exactly_the_names_not_declared_with_one_state_per_trie_node():
    """The complement of the declared names: every short key over an alphabet that meets the names' trie at each
    node is checked against the set, and its automaton has about one state per trie node (each way out of the trie
    reaches one shared free tail; a tail per node doubled the states)."""
    from itertools import product

    from hf_paged.processors.automaton.byte_dfa import anchored, build_byte_dfa
    from hf_paged.processors.schema.key_names import _not_in_names

    alphabet = ["a", "b", "~", " ", "\u00e9"]
    for names in [("a",), ("", "a", "ab"), ("ab", "abb", "b~"), ("\u00e9", "\u00e9a"), ("a b", "ba")]:
        regex = re.compile(_not_in_names(names).text)
        for length in range(4):
            for chars in product(alphabet, repeat=length):
                key = "".join(chars)
                # (free characters are printable ASCII; along a declared name's prefix, that name's own)
                on_trie = max(k for k in range(len(key) + 1) if any(n.startswith(key[:k]) for n in names))
                expected = key not in names and key[on_trie:].isascii()
                assert (regex.fullmatch(f'"{key}"') is not None) == expected, (names, key)
        assert regex.fullmatch(r'"x\"y"') and regex.fullmatch(r'"\\"')  # escaped quote / backslash: no name
    names = tuple(f"property_{i}_{word}" for i in range(40) for word in ("id", "name"))
    nodes = len({name[:k] for name in names for k in range(len(name) + 1)})
    dfa = build_byte_dfa(anchored(_not_in_names(names).text))
    assert dfa.transitions.shape[0] <= nodes + 16


def test_optional_members_and_undeclared_keys_write_the_keys_loop_once():
    """With nothing required, the first member is a declared one or an undeclared key, then the loop of further
    undeclared keys: `(P | E) (, E)*`. The undeclared key is written twice (first, and in the loop), not three
    times (a loop after the declared members, and another after a first undeclared key)."""
    from hf_paged.processors.schema.key_names import _not_in_names

    names = ("alpha", "beta")
    s = {"type": "object", "properties": {n: {"type": "integer"} for n in names}}
    regex = schema_to_regex(s, undeclared_keys=True)
    assert regex.count(_not_in_names(names).text) == 2
    rx = re.compile(regex)
    for text in ['{}', '{"alpha":1}', '{"beta":2,"x":{}}', '{"x":1}', '{"x":1,"y":[2]}', '{"alpha":1,"beta":2,"z":3}']:
        assert rx.fullmatch(text), text
    for text in ['{,}', '{"x":1,"alpha":1}', '{"alpha":1,}', '{"alpha":1"x":1}', '{"beta":1,"alpha":2}']:
        assert not rx.fullmatch(text), text
    at_least_one = re.compile(schema_to_regex({**s, "minProperties": 1}, undeclared_keys=True))
    assert not at_least_one.fullmatch("{}") and at_least_one.fullmatch('{"x":1}') and at_least_one.fullmatch('{"beta":1}')


@pytest.mark.parametrize(("schema", "why"), [
    ({"type": "array", "minItems": 3, "maxItems": 1}, "#: minItems 3 > maxItems 1"),
    ({"type": "string", "minLength": 5, "maxLength": 2}, "#: minLength 5 > maxLength 2"),
    ({"type": "integer", "exclusiveMinimum": 5, "exclusiveMaximum": 6}, "no integer lies within"),
    ({"type": "object", "properties": {"a": {"type": "string", "minLength": 3, "maxLength": 1}}, "required": ["a"]},
     "#/properties/a: minLength 3 > maxLength 1"),
    # without `type`, the keywords' type is what we write (a sound narrowing): the text says so, and how to widen it
    ({"properties": {"a": False}, "required": ["a"]}, "#: no object satisfies it, and without `type`"),
])
def test_an_empty_schema_names_the_part_that_allows_nothing(schema, why):
    """Every such schema got the same text, naming no keyword or place."""
    with pytest.raises(UnsatisfiableSchemaError, match="parts that allow no value: .*" + re.escape(why)):
        schema_to_regex(schema)
