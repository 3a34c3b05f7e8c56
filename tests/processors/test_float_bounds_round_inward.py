"""A float bound is written into the regex as a 17-digit decimal rounded toward the inside of the range: rounded
outward, the decimal parses (as `json.loads` and `jsonschema` read it) to a float past the bound, so the regex would
accept numbers `jsonschema` rejects. Checked against `jsonschema` on the values around each bound."""

from __future__ import annotations

import json
import math
import re

import pytest

from hf_paged.processors.schema import schema_to_regex

jsonschema = pytest.importorskip("jsonschema")

# (keyword, bound, the 17-digit text an outward rounding would allow: it parses to a float past the bound)
CASES = [
    ("maximum", 0.111, "0.11100000000000001"),
    ("minimum", 0.122, "0.12199999999999999"),
    ("exclusiveMaximum", 0.12, "0.11999999999999999"),  # parses to 0.12 itself
    ("exclusiveMinimum", 0.1, "0.10000000000000001"),  # parses to 0.1 itself
]


@pytest.mark.parametrize(("keyword", "bound", "outward"), CASES)
def test_a_float_bound_never_lets_in_a_number_past_it(keyword, bound, outward):
    schema = {"type": "number", keyword: bound}
    rx = schema_to_regex(schema)
    validator = jsonschema.Draft202012Validator(schema)
    assert not validator.is_valid(json.loads(outward))  # (the case is real: past the bound once parsed)
    assert re.fullmatch(rx, outward) is None
    around = [outward, repr(bound), repr(math.nextafter(bound, math.inf)), repr(math.nextafter(bound, -math.inf)),
              f"{bound:.16f}", f"{bound:.18f}", f"{bound:.20f}"]
    for text in around:  # the regex may leave a valid value out, never let an invalid one in
        if re.fullmatch(rx, text) is not None:
            assert validator.is_valid(json.loads(text)), text
    if not keyword.startswith("exclusive"):
        assert re.fullmatch(rx, repr(bound)) is not None  # the bound itself is in range
