"""`minProperties` on objects whose undeclared keys we do not write: the names a `propertyNames` enum lists are
written as declared members; where the schema allows keys we cannot write, the refusal is `UnsupportedSchemaError`
naming `minProperties`, never 'no document satisfies this schema' (`schema/objects.py`)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from hf_paged.errors import UnsatisfiableSchemaError, UnsupportedSchemaError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import accepts, byte_level_tokenizer

jsonschema = pytest.importorskip("jsonschema")

LISTED = {"type": "object", "propertyNames": {"enum": ["a", "b"]}, "minProperties": 2}


def _objects(names: str) -> list[str]:
    """Objects over `names` (in that order) with values 1 or "x", as compact JSON."""
    out = []
    for n in range(len(names) + 1):
        for chosen in itertools.combinations(names, n):
            for values in itertools.product(["1", '"x"'], repeat=n):
                out.append("{" + ",".join(f'"{k}":{v}' for k, v in zip(chosen, values)) + "}")
    return out


def test_listed_property_names_are_written_as_members():
    """It was refused as unsatisfiable: with `propertyNames` no undeclared key was written, so no two keys."""
    proc = JSONSchemaLogitsProcessor(LISTED, byte_level_tokenizer(), index_cache=IndexCache())
    assert accepts(proc, '{"a":1,"b":2}') and not accepts(proc, '{"a":1}') and not accepts(proc, '{"a":1,"c":2}') and not accepts(proc, "{}")


@pytest.mark.parametrize("schema", [
    LISTED,
    {"type": "object", "propertyNames": {"enum": ["a", "b", 3]}, "properties": {"a": {"type": "integer"}},
     "additionalProperties": {"type": "string"}, "minProperties": 1},
    {"type": "object", "propertyNames": {"const": "a", "maxLength": 3}, "properties": {"c": {}}},
    {"type": "object", "propertyNames": {"enum": ["a", "cccc"], "maxLength": 3}, "minProperties": 1},
    {"type": "object", "propertyNames": {"enum": ["a", "b"]}, "not": {"required": ["a"]}, "minProperties": 1},
    {"type": "object", "propertyNames": {"pattern": "^[ac]$"}, "minProperties": 1},  # (keys it allows)
])
def test_listed_property_names_are_exact(schema):
    rx, validator = re.compile(schema_to_regex(schema)), jsonschema.Draft202012Validator(schema)
    texts = _objects("abc")
    valid = {t for t in texts if validator.is_valid(json.loads(t))}
    accepted = {t for t in texts if rx.fullmatch(t)}
    assert accepted == valid and valid


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}, "minProperties": 2},
    {"type": "object", "properties": {"a": {}}, "propertyNames": {"maxLength": 3}, "minProperties": 2},
])
def test_keys_we_do_not_write_make_min_properties_unsupported(schema):
    """Both were 'unsatisfiable', though `{"a": 1, "x": 2}` and `{"a": 1, "b": 2}` are valid."""
    with pytest.raises(UnsupportedSchemaError, match="`minProperties`.*not written here"):
        schema_to_regex(schema)


def test_objects_that_allow_no_more_keys_stay_unsatisfiable():
    for schema in ({"type": "object", "additionalProperties": False, "properties": {"a": {}}, "minProperties": 2},
                   {"type": "object", "propertyNames": {"enum": ["a"]}, "minProperties": 2}):
        with pytest.raises(UnsatisfiableSchemaError):
            schema_to_regex(schema)
