"""A lower bound equal to its upper bound leaves exactly that count: strings of one length, arrays of one size,
objects of one member count, one integer. None of them is the empty language (that is a bound above the other).

Found by the mutation audit (h83): `minLength > maxLength` written `>=` (every schema with minLength == maxLength
refused as unsatisfiable) passed the string and schema translation tests.
"""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors.schema import schema_to_regex


def accepts(schema, text: str) -> bool:
    return re.fullmatch(schema_to_regex(schema), text) is not None


@pytest.mark.parametrize("n", [0, 1, 3])
def test_a_string_of_exactly_n_code_points(n):
    schema = {"type": "string", "minLength": n, "maxLength": n}
    for length in range(5):
        assert accepts(schema, json.dumps("é" * length, ensure_ascii=False)) == (length == n), (n, length)


def test_a_pattern_with_equal_length_bounds():
    schema = {"type": "string", "pattern": "^[a-z]+$", "minLength": 2, "maxLength": 2}
    assert accepts(schema, '"ab"') and not accepts(schema, '"a"') and not accepts(schema, '"abc"')


@pytest.mark.parametrize("n", [0, 1, 3])
def test_an_array_of_exactly_n_items(n):
    schema = {"type": "array", "items": {"type": "integer"}, "minItems": n, "maxItems": n}
    for size in range(5):
        assert accepts(schema, json.dumps(list(range(size)), separators=(",", ":"))) == (size == n), (n, size)


def test_a_tuple_of_exactly_its_prefix():
    schema = {"type": "array", "prefixItems": [{"type": "integer"}, {"type": "string"}], "minItems": 2, "maxItems": 2}
    assert accepts(schema, '[1,"a"]') and not accepts(schema, "[1]") and not accepts(schema, '[1,"a",2]')


def test_one_integer_between_equal_bounds():
    schema = {"type": "integer", "minimum": 7, "maximum": 7}
    assert [accepts(schema, t) for t in ("6", "7", "8", "70", "-7")] == [False, True, False, False, False]


def test_bounds_the_wrong_way_round_are_the_empty_language():
    for schema in ({"type": "string", "minLength": 3, "maxLength": 2},
                   {"type": "array", "minItems": 3, "maxItems": 2},
                   {"type": "integer", "minimum": 8, "maximum": 7}):
        with pytest.raises(UnsatisfiableSchemaError):
            schema_to_regex(schema)


def test_max_items_below_the_prefix_cuts_the_tuple():
    schema = {"type": "array", "prefixItems": [{"type": "integer"}] * 3, "maxItems": 2}
    assert [accepts(schema, t) for t in ("[]", "[1]", "[1,2]", "[1,2,3]")] == [True, True, True, False]
