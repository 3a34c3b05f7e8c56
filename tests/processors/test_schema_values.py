"""`values.valid_values`: its shortcut for `type` / `const` / `enum` schemas decides as jsonschema's evolved validator
does, draft by draft (a keyword the root's draft does not know is skipped by both)."""

from __future__ import annotations

import subprocess
import sys

import jsonschema
import pytest

from hf_paged.processors.schema.context import Context
from hf_paged.processors.schema.values import _simple_check, _type_check, valid_values

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


ALL_DRAFTS = [jsonschema.Draft3Validator, jsonschema.Draft4Validator, jsonschema.Draft6Validator,
              jsonschema.Draft7Validator, jsonschema.Draft201909Validator, jsonschema.Draft202012Validator]
TYPES = ["string", "integer", "number", "boolean", "null", "array", "object"]


@pytest.mark.parametrize("schema", [{}, {"title": "t", "description": "d"}, *({"type": t} for t in TYPES),
                                    {"type": ["integer", "string"]}, {"type": ["number", "null", "boolean"]},
                                    {"type": ["array", "object"], "default": []}])
def test_a_plain_type_is_checked_without_jsonschema_as_every_draft_would(schema):
    """`_type_check`: what each draft's type checker says, in plain Python; where drafts disagree (an integral float
    beside "integer"), or for anything but a plain `type`, it leaves the values to jsonschema."""
    values = [*VALUES, 2.0, -0.0, 10**30, float("inf")]
    for value in values:
        check = _type_check(schema, [value])
        verdicts = {draft(schema).is_valid(value) for draft in ALL_DRAFTS}
        if check is None:
            assert "integer" in str(schema.get("type")) and type(value) is float and value.is_integer()
            assert verdicts == {True, False}  # (drafts 3-4 say no, 6 on say yes)
        else:
            assert verdicts == {check(value)}, (schema, value)
    for other in ({"type": "any"}, {"type": [{"type": "string"}]}, {"type": "string", "maxLength": 2},
                  {"const": 1}, {"type": "string", "$ref": "#/x"}):
        assert _type_check(other, ["a"]) is None


def test_enums_and_consts_of_plain_types_compile_without_importing_jsonschema():
    """jsonschema's import (~90 ms) no longer lands on a process's first schema with an enum or a const."""
    code = ("import sys; from hf_paged.processors.schema import schema_to_grammar; "
            "schema_to_grammar({'type': 'object', 'properties': {'a': {'type': 'string', 'enum': ['x', 'y']}, "
            "'b': {'const': 3}, 'c': {'enum': [1, 'z', None]}}}); print('jsonschema' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.strip() == "False", out.stderr[-2000:]
