"""Whether a declared or required name satisfies `propertyNames` is decided on the decoded name where its JSON
spelling holds an escape that the regex of a bounded or patterned string never writes (`\\"`, `\\\\`, `\\uXXXX`):
the name's spelling was matched against that regex, so `{"required": ["\\""], "propertyNames": {"maxLength": 3}}`
was refused as unsatisfiable and an optional `"\\u0000"` property was silently left out (the schema fuzz, seed
11384 of `test_schema_fuzz.py`)."""

from __future__ import annotations

import json

import pytest

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors.automaton import build_automaton
from hf_paged.processors.schema import schema_to_grammar

jsonschema = pytest.importorskip("jsonschema")

ESCAPED_NAMES = ['"', "\\", "\u0000", 'a"b', "a\\b", "\u001f", '""', "\\u0041", "\ud800", "x\u0000yz"]
NAMES_SCHEMAS = [{"minLength": 1}, {"maxLength": 1}, {"maxLength": 3}, {"minLength": 4}, {"pattern": "^.$"},
                 {"pattern": "^a"}, {"not": {"const": '"'}}, {"type": "string"}, {"maxLength": 2, "pattern": "b$"}]


def _compiled(schema: dict):
    try:
        return build_automaton(schema_to_grammar(schema, strict=True))
    except UnsatisfiableSchemaError:
        return None


@pytest.mark.parametrize("names_schema", NAMES_SCHEMAS, ids=json.dumps)
def test_a_required_escaped_name_is_checked_as_jsonschema_checks_it(names_schema):
    for name in ESCAPED_NAMES:
        schema = {"type": "object", "required": [name], "propertyNames": names_schema}
        document = {name: 1}
        text = json.dumps(document)
        valid = jsonschema.Draft202012Validator(schema).is_valid(document)
        dfa = _compiled(schema)
        if valid:
            assert dfa is not None and dfa.accepts(text.encode("utf-8", "surrogatepass")), (name, names_schema)
        else:
            assert dfa is None, (name, names_schema)  # (the name is required: nothing else satisfies it)


def test_an_optional_escaped_name_is_kept():
    schema = {"type": "object", "properties": {"\u0000": {"type": "integer"}, "\\": {"type": "string"}},
              "propertyNames": {"minLength": 1}, "additionalProperties": False}
    dfa = _compiled(schema)
    for text in ['{"\\u0000":1,"\\\\":"a"}', '{"\\u0000":1}', '{"\\\\":"a"}', "{}"]:
        assert dfa.accepts(text.encode()), text
    assert not dfa.accepts(b'{"\\u0000":"a"}')


def test_the_fuzz_schema():
    schema = {"type": "object", "properties": {"\u0000": {"anyOf": [{"type": "number", "minimum": -0.25}]}},
              "required": ["\u0000", "x"], "propertyNames": {"minLength": 1}, "minProperties": 1}
    dfa = _compiled(schema)
    assert dfa is not None
    text = '{"\\u0000":3,"x":{"a":"b"}}'
    assert jsonschema.Draft202012Validator(schema).is_valid(json.loads(text)) and dfa.accepts(text.encode())
    assert not dfa.accepts(b'{"\\u0000":-1,"x":0}')
