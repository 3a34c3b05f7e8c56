"""The meta-schema check's fast path (jsonschema-rs) agrees with jsonschema: it only ever says "valid" where
jsonschema does, and `load_schema` gives the same result or the same error with it and without it."""

from __future__ import annotations

import sys

import pytest

from hf_paged.errors import InvalidRegexError, InvalidSchemaError
from hf_paged.processors.schema import load as load_module
from hf_paged.processors.schema.load import load_schema

jsonschema = pytest.importorskip("jsonschema")
pytest.importorskip("jsonschema_rs")

SCHEMAS = [
    True, False, {}, {"type": "string"}, {"type": "foo"}, {"type": ["string", "string"]}, {"minLength": -1},
    {"pattern": "("}, {"pattern": "a{2,1}"}, {"pattern": "^[a-z]+$"}, {"patternProperties": {"(": {}}},
    {"patternProperties": {"^x-": {"type": "integer"}}}, {"propertyNames": {"pattern": "["}},
    {"items": [{"type": "string"}]}, {"prefixItems": [{"type": "string"}], "items": False},
    {"$schema": "http://json-schema.org/draft-07/schema#", "items": [{"type": "string"}]},
    {"$schema": "http://json-schema.org/draft-07/schema#", "pattern": "("},
    {"$schema": "http://json-schema.org/draft-04/schema#", "exclusiveMinimum": True, "minimum": 1},
    {"$schema": "https://example.com/custom"}, {"$schema": "not a uri"}, {"enum": []}, {"required": ["a", "a"]},
    {"$defs": {"x": 5}}, {"$anchor": "1bad"}, {"format": 5}, {"multipleOf": 0},
    {"const": {"pattern": "("}},  # data, not a schema: the fast path's false alarm, jsonschema accepts it
    {"type": "object", "properties": {"pattern": {"type": "string", "pattern": "\\d+"}}, "required": ["pattern"]},
    {"$ref": "#/$defs/a", "$defs": {"a": {"type": "array", "items": {"$ref": "#/$defs/a"}}}},
]


def _jsonschema_says_valid(schema) -> bool:
    try:
        jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator).check_schema(schema)
    except jsonschema.exceptions.SchemaError:
        return False
    return True


def _outcome(schema):
    try:
        return "ok", load_schema(schema)
    except (InvalidSchemaError, InvalidRegexError) as exc:
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("schema", SCHEMAS, ids=range(len(SCHEMAS)))
def test_fast_path_says_valid_only_where_jsonschema_does(schema, monkeypatch):
    if load_module._meta_valid_fast(schema):
        assert _jsonschema_says_valid(schema)
    with_fast = _outcome(schema)
    monkeypatch.setitem(sys.modules, "jsonschema_rs", None)  # import fails: the jsonschema path alone
    assert not load_module._meta_valid_fast(schema)
    assert _outcome(schema) == with_fast


def test_fast_path_takes_the_common_case():
    schema = {"type": "object", "properties": {"name": {"type": "string", "pattern": "^[A-Z]"},
                                               "tags": {"type": "array", "items": {"enum": ["a", "b"]}}}}
    assert load_module._meta_valid_fast(schema)
