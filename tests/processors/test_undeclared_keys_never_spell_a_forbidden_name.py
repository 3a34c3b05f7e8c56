"""`not: {required: [...]}` keeps a name out of an object: the object's undeclared keys (additionalProperties, the
default) must not spell that name either, or the regex lets in documents `jsonschema` rejects."""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.processors.schema import schema_to_regex

jsonschema = pytest.importorskip("jsonschema")

DOCS = ['{}', '{"x":1}', '{"y":1}', '{"a":1,"x":2}', '{"x":1,"y":2}', '{"xx":1}', '{"a":1}', '{"b":1}', '{"a":1,"y":2}']


@pytest.mark.parametrize("schema", [
    {"type": "object", "not": {"required": ["x"]}},
    {"type": "object", "not": {"required": ["x"]}, "additionalProperties": {}},
    {"type": "object", "properties": {"a": {"type": "integer"}}, "not": {"required": ["x", "y"]},
     "additionalProperties": {"type": "integer"}},
])
def test_a_forbidden_name_is_not_spelled_by_an_undeclared_key(schema):
    rx = schema_to_regex(schema)
    validator = jsonschema.Draft202012Validator(schema)
    for doc in DOCS:  # never an invalid document (a regex may leave valid ones out)
        if re.fullmatch(rx, doc) is not None:
            assert validator.is_valid(json.loads(doc)), doc
    assert re.fullmatch(rx, '{"x":1}') is None
    for doc in ('{}', '{"y":1}', '{"xx":1}', '{"b":1}'):  # other undeclared keys, and names that only start as x
        assert re.fullmatch(rx, doc) is not None, doc
