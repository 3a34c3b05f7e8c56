"""`values.valid_values`: its shortcut for `type` / `const` / `enum` schemas decides as jsonschema's evolved validator
does, draft by draft (a keyword the root's draft does not know is skipped by both)."""

from __future__ import annotations

import jsonschema
import pytest

from hf_paged.processors.schema.context import Context
from hf_paged.processors.schema.values import _simple_check, valid_values

VALUES = [None, True, False, 0, 1, 1.0, 1.5, -2, "a", "1", "", [], [1], [1.0], {}, {"a": 1}, {"a": 1.0}]
SCHEMAS = [
    {"type": "string"}, {"type": "integer", "title": "n"}, {"type": ["number", "null"], "x-ui": {"hidden": True}},
    {"const": 1}, {"const": [1]}, {"const": {"a": 1}}, {"const": True}, {"enum": [1, "a", None]},
    {"type": "boolean", "const": False, "description": "d", "default": True}, {"type": "array", "enum": [[1], []]},
]
DRAFTS = ["http://json-schema.org/draft-04/schema#", "http://json-schema.org/draft-07/schema#",
          "https://json-schema.org/draft/2020-12/schema"]


@pytest.mark.parametrize("draft", DRAFTS)
@pytest.mark.parametrize("schema", SCHEMAS)
def test_the_shortcut_decides_as_the_evolved_validator(draft, schema):
    root = {"$schema": draft}
    validator = jsonschema.validators.validator_for(root)(root)
    check = _simple_check(validator, schema)
    assert check is not None
    expected = validator.evolve(schema=schema)
    assert [check(v) for v in VALUES] == [expected.is_valid(v) for v in VALUES]
    ctx = Context(root=root)
    assert valid_values(VALUES, schema, ctx) == [v for v in VALUES if expected.is_valid(v)]


def test_other_keywords_take_the_evolved_validator():
    validator = jsonschema.Draft202012Validator({})
    for schema in ({"type": "string", "maxLength": 1}, {"$ref": "#/$defs/x"}, {"not": {"const": 1}}, True,
                   {"type": [{"type": "string"}]}):
        assert _simple_check(validator, schema) is None
    ctx = Context(root={})
    assert valid_values(["a", "ab", 3], {"type": "string", "maxLength": 1}, ctx) == ["a"]
