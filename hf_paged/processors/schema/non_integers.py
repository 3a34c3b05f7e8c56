"""Numbers that are not integers (`not: {type: integer}` beside `number`), as Python's `json` + `jsonschema` see them.

JSON Schema's "integer" is any number whose value has no fractional part: `1.0`, `1.5e1` and `8.9E120` are integers,
and so is a text whose float rounds to one (`1.00000000000000000001`, `0.99999999999999999999`, `1e-400`). We write
a subset that no rounding can turn into an integer: a fraction ending in a non-zero digit, no exponent, at most 15
significant digits (`DBL_DIG`: such a decimal survives the trip through a double, so its float keeps the fraction).
Integer and fraction digits also respect `NumberDigits` where the user bounds them. With bounds or `multipleOf` on
the same schema this is refused (the two digit languages would have to be intersected).
"""

from __future__ import annotations

from hf_paged.processors.schema.context import Context
from hf_paged.processors.schema.digits import DEFAULT_DIGITS
from hf_paged.processors.schema.fragments import Rx, alt, raw
from hf_paged.processors.schema.numbers import number_regex

__all__ = ["non_integer_regex"]

_SIGNIFICANT = 15  # decimal digits a double round-trips (DBL_DIG)
_NUMBER_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf")


def non_integer_regex(schema: dict, ctx: Context, pointer: str) -> Rx | None:
    """Numbers with a fractional part; beside numeric keywords unsupported (strict=False: any number, warned)."""
    if any(k in schema for k in _NUMBER_KEYWORDS):
        ctx.unsupported("not", pointer, "`not: {type: integer}` is supported on numbers without bounds or "
                        "`multipleOf`; write the non-integer values as an `enum`, or drop `not`")
        return number_regex(schema, ctx, pointer)  # (strict=False: looser, integers too)
    d = ctx.number_digits if ctx.number_digits is not None else DEFAULT_DIGITS
    max_int = _SIGNIFICANT - 1 if d.integer is None else min(_SIGNIFICANT - 1, d.integer)
    max_frac = _SIGNIFICANT if d.fraction is None else min(d.fraction, 24)
    parts = []
    # |x| < 1: `0.` then z zeros, a non-zero digit and at most 14 more (15 significant digits)
    for zeros in range(max_frac):
        more = min(_SIGNIFICANT - 1, max_frac - zeros - 1)
        parts.append(raw("-?0\\." + "0" * zeros + "[1-9]" + (f"[0-9]{{0,{more}}}" if more else ""), atomic=True))
    # |x| >= 1: n integer digits, then a fraction of at most 15 - n digits ending in a non-zero one
    for n in range(1, max_int + 1):
        frac = min(_SIGNIFICANT - n, max_frac)
        head = "[1-9]" + (f"[0-9]{{{n - 1}}}" if n > 1 else "")
        parts.append(raw(f"-?{head}\\.{f'[0-9]{{0,{frac - 1}}}' if frac > 1 else ''}[1-9]", atomic=True))
    return alt(parts)
