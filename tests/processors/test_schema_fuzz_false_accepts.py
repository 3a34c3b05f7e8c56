"""Documents drawn through JSONSchemaLogitsProcessor's masks and validated with `jsonschema` (h98's differential
fuzz, /tmp/h98): the minimal cases of the false accepts it found, each an invalid text the constraint let end."""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import accepts, byte_level_tokenizer

jsonschema = pytest.importorskip("jsonschema")


def proc_tokenizer():
    return byte_level_tokenizer()


# JSON Schema's integer is any number without a fractional part, and Python's float rounding makes more texts one
NOT_INTEGER = {"type": "number", "not": {"type": "integer"}}
INTEGER_TEXTS = ["5", "-0", "1.0", "2.50e1", "8.9E120", "1e-400", "1.00000000000000000001", "0.99999999999999999999",
                 "12345678901234567.5"]
FRACTION_TEXTS = ["0.5", "-1.25", "12345678901234.5", "0.000000000001"]


def test_not_integer_numbers_refuse_every_integer_spelling():
    validator = jsonschema.Draft202012Validator(NOT_INTEGER)
    rx = schema_to_regex(NOT_INTEGER)
    for text in INTEGER_TEXTS:
        assert not validator.is_valid(json.loads(text)), text  # (the case is real)
        assert re.fullmatch(rx, text) is None, text
    for text in FRACTION_TEXTS:
        assert validator.is_valid(json.loads(text)) and re.fullmatch(rx, text), text
    proc = JSONSchemaLogitsProcessor(NOT_INTEGER, proc_tokenizer(), index_cache=IndexCache())
    assert not accepts(proc, "8.9E120") and not accepts(proc, "3") and accepts(proc, "-1.25")


def test_not_integer_beside_other_types_and_bounds():
    rx = schema_to_regex({"type": ["number", "string"], "not": {"type": "integer"}, "maxLength": 1})
    assert re.fullmatch(rx, "1.5") and re.fullmatch(rx, '"a"') and not re.fullmatch(rx, "1")
    assert not re.fullmatch(schema_to_regex({"type": "number", "not": {"type": ["integer", "string"]}}), "1e2")
    with pytest.raises(ValueError, match="not"):  # bounds and a fraction-only language are not intersected
        schema_to_regex({"type": "number", "maximum": 3, "not": {"type": "integer"}})
    with pytest.warns(UserWarning, match="not"):
        schema_to_regex({"type": "number", "maximum": 3, "not": {"type": "integer"}}, strict=False)


def test_a_unicode_property_pattern_is_unsupported_not_invalid():
    """`\\p{L}` is valid ECMA-262 (what JSON Schema's `pattern` is) that Python's `re`, used by the meta-schema check,
    rejects: the error is the translation's 'unsupported', not 'does not compile; fix the pattern'."""
    from hf_paged.errors import UnsupportedSchemaError
    from hf_paged.processors.schema import load_schema

    with pytest.raises(UnsupportedSchemaError, match="Unicode property"):
        load_schema({"type": "string", "pattern": "^\\p{L}+$"})
    with pytest.raises(ValueError, match="does not compile"):
        load_schema({"type": "string", "pattern": "^(+$"})
    with pytest.raises(UnsupportedSchemaError, match="word boundaries"):  # (not "anchors (^ $)" alone)
        schema_to_regex({"type": "string", "pattern": "\\bfoo\\b"})


@pytest.mark.parametrize("pattern", ["^[^\\d]$", "^[^a\\d]$", "^[^\\w]$", "^[^\\s]$", "^[^\\S]$", "^[^\\D]$"])
def test_a_negated_class_refuses_what_pythons_class_items_match(pattern):
    """A negated class complements its items, so each `\\d \\w \\s` item in it must take its widest reading (ECMA's
    or Python's, which jsonschema uses): the ASCII tables left the Unicode digits, letters and U+0085 in `[^..]`."""
    schema = {"type": "string", "pattern": pattern}
    validator = jsonschema.Draft202012Validator(schema)
    rx = schema_to_regex(schema)
    for char in ["\u0663", "\u0660", "\u00e9", "\u00aa", "\x85", "\ufeff", "\u2028", " ", "a", "_", "5", "%"]:
        for text in {json.dumps(char), json.dumps(char, ensure_ascii=False)}:
            if re.fullmatch(rx, text):
                assert validator.is_valid(char), (pattern, text)
    assert re.fullmatch(rx, {"^[^\\D]$": '"5"', "^[^\\S]$": '" "'}.get(pattern, '"%"'))  # (not everything refused)


def test_unevaluated_properties_see_the_anyof_option_that_passed():
    """An `anyOf` / `oneOf` option is evaluated in place: the properties of the option that passes count as evaluated
    for its parent's `unevaluatedProperties: false`. Distributed as a sibling of the parent it did not, and the
    schema below (valid: {"a": 1}) was refused as unsatisfiable."""
    for key in ("anyOf", "oneOf"):
        schema = {"type": "object", "unevaluatedProperties": False,
                  key: [{"properties": {"a": {}}, "required": ["a"]}, {"properties": {"b": {}}, "required": ["b"]}]}
        rx = schema_to_regex(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for text in ['{"a":1}', '{"b":true}']:
            assert validator.is_valid(json.loads(text)) and re.fullmatch(rx, text), text
        for text in ["{}", '{"c":1}', '{"a":1,"c":1}']:
            assert not validator.is_valid(json.loads(text)) and not re.fullmatch(rx, text), text
    # an `allOf` part's unevaluatedProperties sees neither its siblings nor the parent's anyOf options
    schema = {"allOf": [{"properties": {"foo": True}, "unevaluatedProperties": False}],
              "anyOf": [{"properties": {"bar": True}}]}
    rx = schema_to_regex(schema)
    assert re.fullmatch(rx, '{"foo":1}') and not re.fullmatch(rx, '{"bar":1}')
    assert not jsonschema.Draft202012Validator(schema).is_valid({"bar": 1})


def test_positive_multiples_of_a_power_of_ten_leave_out_zero():
    """`multipleOf: 10` (100, 1000, ...) above 0: the suffix rule's placeholder for 'no multiple shorter than the
    suffix' was a second `0` branch, which dropping the zero branch left in: 0 got through `exclusiveMinimum: 0`."""
    for schema in ({"type": "integer", "exclusiveMinimum": 0, "multipleOf": 10},
                   {"type": "number", "exclusiveMinimum": 0.5, "multipleOf": 100}):
        rx = schema_to_regex(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for text in ["0", "10", "100", "1000", "5", "110"]:
            if re.fullmatch(rx, text):
                assert validator.is_valid(json.loads(text)), (schema, text)
        assert not re.fullmatch(rx, "0") and re.fullmatch(rx, "1000")


def test_a_bound_exclusive_of_the_largest_double_is_unsatisfiable_not_a_crash():
    from hf_paged.errors import UnsatisfiableSchemaError

    for key, bound in (("exclusiveMinimum", 1.7976931348623157e308), ("exclusiveMaximum", -1.7976931348623157e308)):
        with pytest.raises(UnsatisfiableSchemaError, match="largest"):
            schema_to_regex({"type": "number", key: bound})


def test_lone_surrogates_in_a_schema_are_written_as_escapes():
    """JSON text may hold a lone surrogate (`"\\ud800"`); `json.loads` keeps it, UTF-8 cannot encode it: the processor
    raised UnicodeEncodeError building its key. Values and names holding one are now spelled with `\\uXXXX`."""
    text = '{"type": "object", "properties": {"\\ud800": {"enum": ["a", "\\udfff"]}}, "required": ["\\ud800"]}'
    schema = json.loads(text)
    proc = JSONSchemaLogitsProcessor(text, proc_tokenizer(), index_cache=IndexCache())
    doc = '{"\\ud800":"\\udfff"}'
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(doc)) and accepts(proc, doc)
    assert not accepts(proc, '{"\\ud800":"b"}')


DRAWN_SCHEMAS = [
    NOT_INTEGER,
    {"type": "integer", "exclusiveMinimum": 0, "multipleOf": 10},
    {"type": "string", "pattern": "^[^\\d\\s]{1,3}$"},
    {"type": "object", "unevaluatedProperties": False,
     "anyOf": [{"properties": {"a": {"type": "integer"}}, "required": ["a"]}, {"properties": {"b": {}}, "required": ["b"]}]},
    {"type": "object", "required": ["n"], "additionalProperties": False,
     "properties": {"n": {"type": "number", "exclusiveMinimum": 0.1, "maximum": 2.5}, "s": {"type": "string", "maxLength": 2}}},
]


@pytest.mark.parametrize("schema", DRAWN_SCHEMAS, ids=range(len(DRAWN_SCHEMAS)))
def test_documents_drawn_through_the_masks_validate(schema):
    """A small fixed-seed run of h98's sampler: random logits (biased toward EOS and closing characters so documents
    end) masked by `process_rows` as the engine applies them; every document that ends with EOS must parse and
    validate (the full fuzz, thousands of schemas x documents, lives outside the suite)."""
    import torch

    tok = proc_tokenizer()
    proc = JSONSchemaLogitsProcessor(schema, tok, index_cache=IndexCache())
    vocab_size, eos = proc.vocab.vocab_size, tok.eos_token_id
    closing = torch.tensor([any(c in tok.decode([i]) for c in '"}],') for i in range(vocab_size)], dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    rows, ids = 16, [f"r{i}" for i in range(16)]
    histories: list[list[int]] = [[] for _ in range(rows)]
    for step in range(48):
        live = [i for i in range(rows) if not histories[i] or histories[i][-1] != eos]
        if not live:
            break
        scores = torch.rand(len(live), vocab_size, generator=gen) * 8 + closing * 3
        scores[:, eos] += step * 0.5
        proc.process_rows([ids[i] for i in live], [histories[i] for i in live], scores)
        for row, pick in zip(live, scores.argmax(dim=1).tolist()):
            histories[row].append(pick)
    validator = jsonschema.Draft202012Validator(schema)
    ended = [h for h in histories if h and h[-1] == eos]
    assert len(ended) >= rows // 2
    for history in ended:
        text = tok.decode(history, skip_special_tokens=True)
        assert validator.is_valid(json.loads(text)), text


def test_not_required_refuses_every_value_that_is_no_object():
    """`required` holds for every value that is not an object, so `not: {required: [...]}` refuses them all: without
    a `type`, {"not": {"required": ["z"]}} let 0, "a" and null through (h98's random object schemas)."""
    for schema in ({"not": {"required": ["z"]}}, {"type": ["integer", "object"], "not": {"required": ["z"]}}):
        rx = schema_to_regex(schema)
        validator = jsonschema.Draft202012Validator(schema)
        for text in ["0", '"a"', "null", "[]", '{"z":1}']:
            assert not validator.is_valid(json.loads(text)) and not re.fullmatch(rx, text), (schema, text)
        assert re.fullmatch(rx, '{"a":1}')


@pytest.mark.parametrize(("schema", "invalid", "valid"), [
    # one trigger under dependentRequired and dependentSchemas: the second replaced the first
    ({"type": "object", "dependentRequired": {"b": ["a"]}, "dependentSchemas": {"b": {"required": ["c"]}}},
     ['{"b":0,"c":1}', '{"b":0,"a":1}'], '{"b":0,"a":1,"c":2}'),
    # an allOf part's additionalProperties binds keys only another part's patternProperties match
    ({"type": "object", "allOf": [{"additionalProperties": {"type": "integer"}}, {"patternProperties": {"^a": {}}}]},
     ['{"a":"x"}'], '{"a":1}'),
    ({"type": "object", "patternProperties": {"^a": {}}, "allOf": [{"additionalProperties": {"type": "integer"}}]},
     ['{"a":"x"}'], '{"a":1}'),
])
def test_object_keywords_merged_from_several_places_all_hold(schema, invalid, valid):
    rx = schema_to_regex(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in invalid:
        assert not validator.is_valid(json.loads(text)) and not re.fullmatch(rx, text), text
    assert validator.is_valid(json.loads(valid)) and re.fullmatch(rx, valid)


@pytest.mark.parametrize(("schema", "invalid"), [
    # a branch without `type` accepts every value its keywords do not bind: {"multipleOf": 3} accepts {"a": 1}
    ({"oneOf": [{"type": "object", "required": ["a"]}, {"multipleOf": 3, "minimum": -9, "maximum": 9}]}, '{"a":1}'),
    ({"oneOf": [{"type": "string", "maxLength": 1}, {"minimum": 2}]}, '""'),
    ({"oneOf": [{"type": "null"}, {"anyOf": [{"type": "integer"}, {"maximum": 9}]}]}, "null"),
    # a branch with `const` writes its value whatever its other keywords' types: {"const": 1, "maxLength": 1} is 1
    ({"allOf": [{"oneOf": [{"maxLength": 1}, {"required": ["b"]}]}, {"const": 1}]}, "1"),
])
def test_oneof_exclusivity_reads_what_the_other_branches_accept(schema, invalid):
    """oneOf's exclusivity compared a branch's types with the types another branch is written as (its keywords'
    types, a narrowing that is sound for writing it), not with those it accepts (h98's random combinator schemas)."""
    validator = jsonschema.Draft202012Validator(schema)
    assert not validator.is_valid(json.loads(invalid))
    try:
        rx = schema_to_regex(schema)
    except ValueError:  # (refusing the oneOf is sound too)
        return
    assert not re.fullmatch(rx, invalid)


def test_a_merged_contains_keeps_each_parts_min_contains():
    """`allOf` parts' `contains` merge into one; the merged minContains took the parent's 0 and dropped the part's
    implicit 1, so {minContains: 0, allOf: [{contains: {const: 1}}]} accepted [] (h98's random array schemas)."""
    for schema in ({"type": "array", "minContains": 0, "allOf": [{"contains": {"const": 1}}]},
                   {"type": "array", "contains": {"type": "integer"}, "minContains": 0, "oneOf": [{"contains": True}]}):
        rx = schema_to_regex(schema)
        validator = jsonschema.Draft202012Validator(schema)
        assert not validator.is_valid([]) and not re.fullmatch(rx, "[]"), schema
        assert re.fullmatch(rx, "[1]")


def test_const_true_and_const_one_are_different_values_under_all_of():
    """`allOf` merging took `const: true` and `const: 1` for one value (Python's `True == 1`): `{"k": true}` passed a
    property that nothing satisfies."""
    rx = re.compile(schema_to_regex({"properties": {"k": {"allOf": [{"const": True}, {"const": 1}]}}}))
    assert rx.fullmatch("{}") and not rx.fullmatch('{"k":true}') and not rx.fullmatch('{"k":1}')
    rx = re.compile(schema_to_regex({"properties": {"k": {"allOf": [{"const": [True]}, {"enum": [[1], [True]]}]}}}))
    assert rx.fullmatch('{"k":[true]}') and not rx.fullmatch('{"k":[1]}')


def test_an_enum_beside_a_format_keeps_the_strings_the_format_spells():
    """`format` is enforced on every string, but an enum's values were checked by jsonschema, which asserts no
    format: `"nope"` came out of `{"format": "date", "enum": [...]}` (found by the session-30 fuzz)."""
    rx = re.compile(schema_to_regex({"type": "string", "format": "date", "enum": ["2020-01-01", "nope"]}))
    assert rx.fullmatch('"2020-01-01"') and not rx.fullmatch('"nope"')
    mixed = re.compile(schema_to_regex({"format": "date", "enum": ["nope", 3]}))  # (a format binds strings only)
    assert mixed.fullmatch("3") and not mixed.fullmatch('"nope"')
    with pytest.raises(UnsatisfiableSchemaError):
        schema_to_regex({"format": "date", "const": "nope"})


def test_not_false_holds_for_every_value_and_not_true_for_none():
    """`{"type": "object", "not": false}` was refused with a message about `not: {required: [...]}` (found by the
    session-30 fuzz; the suite's `not#6`)."""
    rx = re.compile(schema_to_regex({"type": "object", "not": False}))
    assert rx.fullmatch("{}") and rx.fullmatch('{"a":1}') and not rx.fullmatch("1")
    for never in ({"type": "object", "not": True}, {"not": {}}):
        with pytest.raises(UnsatisfiableSchemaError):
            schema_to_regex(never)
