"""A float bound is written into the regex as a 17-digit decimal rounded toward the inside of the range: rounded
outward, the decimal parses (as `json.loads` and `jsonschema` read it) to a float past the bound, so the regex would
accept numbers `jsonschema` rejects. Checked against `jsonschema` on the values around each bound."""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal

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


# Doubles above their shortest text (0.1 is 0.1000000000000000055...) and below it (0.122 is 0.1219999999999999973...)
FLOAT_BOUNDS = [0.1, 0.001, 0.3, 0.7, 1 / 3, 123.456, 4.35, 0.07, 1e-7, 1.5e-5, 999999999999999.9, 0.122, 2.5, -0.1,
                -0.001, -4.35]


@pytest.mark.parametrize("bound", FLOAT_BOUNDS)
def test_an_inclusive_bound_admits_its_own_shortest_text(bound):
    """Rounded inward to 17 digits, `minimum: 0.1` refused "0.1" (the decimal bound became 0.10000000000000001) and
    `minimum = maximum = 0.1` was unsatisfiable (the schema fuzz's false refusals); the shortest text parses to the
    bound itself, so every decimal on its inner side is within the bound too."""
    text = format(Decimal(repr(bound)), "f")  # (bounded numbers are written without an exponent)
    for schema in ({"type": "number", "minimum": bound}, {"type": "number", "maximum": bound},
                   {"type": "number", "minimum": bound, "maximum": bound}):
        rx = schema_to_regex(schema)
        assert re.fullmatch(rx, text) is not None, (schema, text)
        validator = jsonschema.Draft202012Validator(schema)
        for near in (math.nextafter(bound, math.inf), math.nextafter(bound, -math.inf)):
            for spelling in (repr(near), f"{near:.17f}", f"{near:.20f}", f"{bound:.17f}", f"{bound:.20f}"):
                if re.fullmatch(rx, spelling) is not None:  # (never a number past the bound)
                    assert validator.is_valid(json.loads(spelling)), (schema, spelling)
