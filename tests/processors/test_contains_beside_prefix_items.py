"""`contains` beside `prefixItems`: the match was put on the first items only, so `prefixItems: [boolean]` with
`contains: string` was refused as unsatisfiable though `[false, "b"]` is valid (h1's fuzz). A match now goes to the
earliest positions whose item can hold one (one alternative each for a single match)."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import accepts, byte_level_tokenizer

jsonschema = pytest.importorskip("jsonschema")


BOOLEAN, STRING, INTEGER = {"type": "boolean"}, {"type": "string"}, {"type": "integer"}


@pytest.mark.parametrize("schema, accepted, refused", [
    ({"type": "array", "prefixItems": [BOOLEAN], "contains": STRING}, ['[false,"b"]', '[true,"b",3]'],
     ["[false]", "[false,1]", '["a"]', "[]"]),
    ({"type": "array", "prefixItems": [{"type": ["boolean", "string"]}], "contains": STRING},  # either position
     ['["a"]', '[false,"b"]', '["a",1]'], ["[false]", "[false,1]"]),
    ({"type": "array", "prefixItems": [STRING, BOOLEAN, STRING], "items": False, "contains": STRING, "minContains": 2},
     ['["a",true,"b"]'], ['["a",true]', '["a",true,"b","c"]', '["a",true,1]']),  # (positions 0 and 2)
    ({"type": "array", "prefixItems": [BOOLEAN, BOOLEAN], "contains": STRING, "minContains": 2},
     ['[true,false,"a","b"]'], ['[true,false,"a"]', '[true,"a","b"]']),
])
def test_a_match_goes_where_an_item_can_hold_it(schema, accepted, refused):
    validator = jsonschema.Draft202012Validator(schema)
    proc = JSONSchemaLogitsProcessor(schema, byte_level_tokenizer(), index_cache=IndexCache())
    for text in accepted:
        assert validator.is_valid(json.loads(text)) and accepts(proc, text), text
    for text in refused:
        assert not validator.is_valid(json.loads(text)) and not accepts(proc, text), text


def test_no_false_accept_and_unsatisfiable_only_when_no_array_is_valid():
    values = [True, "a", 1]
    arrays = [list(a) for n in range(6) for a in itertools.product(values, repeat=n)]
    prefixes = [[], [BOOLEAN], [BOOLEAN, BOOLEAN], [STRING, BOOLEAN, STRING]]
    for prefix, items, contains, more, max_items in itertools.product(
            prefixes, [None, False, INTEGER], [STRING, INTEGER], [None, 2], [None, 3]):
        schema: dict = {"type": "array", "prefixItems": prefix, "contains": contains}
        for key, value in (("items", items), ("minContains", more), ("maxItems", max_items)):
            if value is not None:
                schema[key] = value
        validator = jsonschema.Draft202012Validator(schema)
        valid = [a for a in arrays if validator.is_valid(a)]
        try:
            rx = re.compile(schema_to_regex(schema))
        except UnsatisfiableSchemaError:
            assert not valid, schema
            continue
        assert valid, schema
        for array in arrays:
            if rx.fullmatch(json.dumps(array, separators=(",", ":"))):
                assert validator.is_valid(array), (schema, array)
