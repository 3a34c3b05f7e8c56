"""Integers and numbers: digit-range alternations, bounds, float rounding, multipleOf."""

from __future__ import annotations

import re
from decimal import Decimal

import pytest

from hf_paged.errors import UnsupportedSchemaError
from hf_paged.processors.schema import schema_to_regex
from hf_paged.processors.schema.numbers import decimal_range, int_range


def accepts(schema, text: str) -> bool:
    return re.fullmatch(schema_to_regex(schema), text) is not None


@pytest.mark.parametrize("lo,hi", [(None, None), (0, None), (None, 0), (-5, 5), (-123, 4567), (7, 7), (10, 99),
                                   (-99, -10), (None, -13), (13, None), (1, 1000)])
def test_int_range_matches_exactly_the_range(lo, hi):
    rx = re.compile(int_range(lo, hi).text)
    for v in range(-1200, 5000):
        expected = (lo is None or v >= lo) and (hi is None or v <= hi)
        assert bool(rx.fullmatch(str(v))) == expected, v
    assert not rx.fullmatch("-0") and not rx.fullmatch("007")


def test_int_range_empty_when_inverted():
    assert int_range(5, 4) is None


@pytest.mark.parametrize("lo,hi", [("0", None), (None, "1.25"), ("-1.25", "0.5"), ("0.001", "0.1"), ("2.5", "10.05")])
def test_decimal_range_matches_exact_values(lo, hi):
    dlo = Decimal(lo) if lo else None
    dhi = Decimal(hi) if hi else None
    rx = re.compile(decimal_range(dlo, dhi).text)
    for i in range(-30, 30):
        for frac in ("", ".0", ".5", ".25", ".05", ".001", ".999", ".1", ".0001"):
            text = f"{i}{frac}"
            v = Decimal(text)
            expected = (dlo is None or v >= dlo) and (dhi is None or v <= dhi)
            assert bool(rx.fullmatch(text)) == expected, text
    assert not rx.fullmatch("1e3") and not rx.fullmatch("1.")


def test_integer_bounds_inclusive_and_exclusive():
    s = {"type": "integer", "minimum": 1, "exclusiveMaximum": 12}
    assert [accepts(s, str(v)) for v in (0, 1, 11, 12)] == [False, True, True, False]
    assert not accepts(s, "5.0")  # we only write integers without fraction


def test_integer_with_float_bounds_uses_exact_values():
    s = {"type": "integer", "minimum": 0.5, "maximum": 2.5}
    assert [accepts(s, str(v)) for v in (0, 1, 2, 3)] == [False, True, True, False]


def test_draft4_boolean_exclusive_bounds():
    s = {"type": "integer", "minimum": 0, "exclusiveMinimum": True, "maximum": 3, "exclusiveMaximum": True}
    assert [accepts(s, str(v)) for v in (0, 1, 2, 3)] == [False, True, True, False]


def test_number_is_not_only_integers():
    s = {"type": "number"}
    for text in ("0", "-1.5", "3.25", "1e-7", "2E+10"):
        assert accepts(s, text), text
    for text in ("01", "1.", ".5", "-", "+1", "NaN"):
        assert not accepts(s, text), text


def test_number_exclusive_bound_is_safe_under_float_rounding():
    s = {"type": "number", "exclusiveMaximum": 3}
    assert accepts(s, "2.5")
    assert not accepts(s, "3")
    # float("2.99999999999999999999") == 3.0, which jsonschema rejects: the regex must too.
    assert float("2.99999999999999999999") == 3.0
    assert not accepts(s, "2.99999999999999999999")


def test_number_bounds_drop_exponent_form():
    s = {"type": "number", "minimum": 0, "maximum": 1}
    assert accepts(s, "0.75") and accepts(s, "1") and accepts(s, "0")
    assert not accepts(s, "1.01") and not accepts(s, "-0.1") and not accepts(s, "1e-3")


def test_multiple_of_integer_steps():
    s = {"type": "integer", "multipleOf": 5}
    assert [accepts(s, t) for t in ("0", "5", "-10", "1005", "7", "12")] == [True, True, True, True, False, False]
    bounded = {"type": "integer", "multipleOf": 7, "minimum": 0, "maximum": 30}
    assert [v for v in range(-5, 40) if accepts(bounded, str(v))] == [0, 7, 14, 21, 28]


def test_multiple_of_on_number_writes_integer_multiples():
    s = {"type": "number", "multipleOf": 2}
    assert accepts(s, "4") and not accepts(s, "3") and not accepts(s, "4.5")


def test_fractional_multiple_of_is_unsupported_then_dropped_with_a_warning():
    s = {"type": "number", "multipleOf": 0.01}
    with pytest.raises(UnsupportedSchemaError, match=r"multipleOf.*#/multipleOf"):
        schema_to_regex(s)
    with pytest.warns(UserWarning, match="multipleOf"):
        schema_to_regex(s, strict=False)


def test_unbounded_multiple_of_odd_step_is_unsupported():
    with pytest.raises(UnsupportedSchemaError, match="multipleOf"):
        schema_to_regex({"type": "integer", "multipleOf": 7})


def test_finite_domains_are_checked_value_by_value():
    # a bounded integer range beside `not` / `multipleOf`: every integer is checked against the whole schema
    s = {"type": "integer", "minimum": 100, "exclusiveMaximum": 200, "multipleOf": 13,
         "not": {"anyOf": [{"multipleOf": 2}, {"multipleOf": 3}]}}
    rx = re.compile(schema_to_regex(s))
    assert [v for v in range(90, 210) if rx.fullmatch(str(v))] == [143, 169]  # 13 x 11, 13 x 13: odd, not 3k
    # an enum beside `if`/`then`/`else` and `not`
    s = {"enum": [1, 2, 3, 4, 5, 6], "if": {"maximum": 3}, "then": {"multipleOf": 2}, "else": {"minimum": 5},
         "not": {"const": 6}}
    rx = re.compile(schema_to_regex(s))
    assert [v for v in range(8) if rx.fullmatch(str(v))] == [2, 5]
    # unbounded: (maximum 3 and minimum 2) or above 3 (`conditionals.py`), no finite set
    rx = re.compile(schema_to_regex({"type": "integer", "minimum": 0, "if": {"maximum": 3}, "then": {"minimum": 2}}))
    assert [v for v in range(8) if rx.fullmatch(str(v))] == [2, 3, 4, 5, 6, 7] and rx.fullmatch("123456789")


def test_bounded_multiples_beyond_the_enumeration_limit_are_checked_as_a_finite_set():
    rx = re.compile(schema_to_regex({"type": "integer", "minimum": 0, "maximum": 4000, "multipleOf": 5}))  # 801
    assert rx.fullmatch("3995") and rx.fullmatch("0") and not rx.fullmatch("3996") and not rx.fullmatch("4005")
