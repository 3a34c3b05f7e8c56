"""Several `contains` under `allOf` ask for an item each, not one item of all (`schema/contains.py`): compiled as
alternatives that place the matches, each a subset of the valid arrays, checked against jsonschema."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from hf_paged.errors import UnsupportedSchemaError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import accepts, byte_level_tokenizer

jsonschema = pytest.importorskip("jsonschema")

INTEGER, STRING = {"type": "integer"}, {"type": "string"}
TWO = {"type": "array", "allOf": [{"contains": INTEGER}, {"contains": STRING}]}


def _validator(schema: dict):
    return jsonschema.validators.validator_for(schema, default=jsonschema.Draft202012Validator)(schema)


def _arrays() -> list[str]:
    """Every array of up to three items drawn from a few values, as compact JSON."""
    values = ["1", "-2", '"a"', "true", "null", "[]"]
    return ["[" + ",".join(items) + "]" for n in range(4) for items in itertools.product(values, repeat=n)]


def _verdicts(schema: dict) -> tuple[set[str], set[str]]:
    """(the arrays of `_arrays` the regex accepts, those jsonschema finds valid); asserts no false accept."""
    rx, validator = re.compile(schema_to_regex(schema)), _validator(schema)
    accepted = {t for t in _arrays() if rx.fullmatch(t)}
    valid = {t for t in _arrays() if validator.is_valid(json.loads(t))}
    assert accepted <= valid, sorted(accepted - valid)
    return accepted, valid


def test_an_item_for_each_contains_through_the_processor():
    """It was refused as unsatisfiable: `contains: {allOf: [integer, string]}` asked one item to be both."""
    proc = JSONSchemaLogitsProcessor(TWO, byte_level_tokenizer(), index_cache=IndexCache())
    assert accepts(proc, '[1,"a"]') and accepts(proc, '["a",1]')
    assert not accepts(proc, "[1]") and not accepts(proc, '["a"]') and not accepts(proc, "[]") and not accepts(proc, "[1,2]")


@pytest.mark.parametrize("schema", [
    TWO,
    {"type": "array", "maxItems": 1, "allOf": [{"contains": INTEGER}, {"contains": {"minimum": 0}}]},  # (one item)
    {"type": "array", "prefixItems": [{"type": "boolean"}], "allOf": [{"contains": INTEGER}, {"contains": STRING}]},
    {"type": "array", "items": {"not": {"type": "null"}}, "allOf": [{"contains": INTEGER, "minContains": 2},
                                                                    {"contains": STRING}]},
    {"type": "array", "allOf": [{"contains": INTEGER}, {"allOf": [{"contains": STRING}, {"contains": {"const": True}}]}]},
    {"$schema": "http://json-schema.org/draft-07/schema#", "type": "array", "items": {"type": ["integer", "string"]},
     "allOf": [{"contains": INTEGER}, {"contains": STRING}]},  # (placed as tuple `items`)
])
def test_several_contains_compile_without_false_accepts(schema):
    accepted, valid = _verdicts(schema)
    assert accepted and valid


def test_enum_values_are_checked_against_the_placed_items():
    """Finite values are checked with the root's validator: a draft-07 one reads tuple `items`, not `prefixItems`."""
    for draft in ("http://json-schema.org/draft-07/schema#", "https://json-schema.org/draft/2020-12/schema"):
        schema = {"$schema": draft, "enum": [[1, "a"], [1], ["a"], [2, 3]], "allOf": [{"contains": INTEGER},
                                                                                      {"contains": STRING}]}
        rx = re.compile(schema_to_regex(schema))
        assert rx.fullmatch('[1,"a"]') and not rx.fullmatch("[1]") and not rx.fullmatch('["a"]'), draft


def test_contains_we_cannot_place_are_refused_as_unsupported():
    with pytest.raises(UnsupportedSchemaError, match="`contains`.*maxContains"):
        schema_to_regex({"type": "array", "allOf": [{"contains": INTEGER, "maxContains": 1}, {"contains": STRING}]})
    with pytest.raises(UnsupportedSchemaError, match="more than 16 matching items"):
        schema_to_regex({"type": "array", "allOf": [{"contains": INTEGER, "minContains": 9},
                                                    {"contains": STRING, "minContains": 9}]})
