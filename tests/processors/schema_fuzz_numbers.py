"""Number schemas and number texts near their bounds, for the schema fuzz (`test_schema_fuzz.py`).

`number_schema(seed)` bounds integers or numbers with `minimum`/`maximum` (exclusive or not), `multipleOf` and
`not` of values, from a pool that holds the hard cases: doubles whose shortest text is not their exact value
(0.1, 1/3), integers past 2**53 that no double equals, the largest double, the smallest. `number_texts(schema)`
writes numbers at and around each bound in many spellings (17 and 20 more digits, exponents, trailing zeros):
texts that `json.loads` rounds to a double on the far side of a bound are the ones that slip through.
"""

from __future__ import annotations

import json
import random
from decimal import Decimal, InvalidOperation
from typing import Any

__all__ = ["number_schema", "number_texts"]

BOUNDS = [0, 1, -1, 3, 10, 100, -7, 0.1, 0.5, -0.5, 2.5, 1e-7, 1.5e-5, 123.456, 0.30000000000000004, 9007199254740993,
          9007199254740992, 2 ** 63, -(2 ** 63), 1e16, 1e21, 1.7976931348623157e308, -1e308, 5e-324, 1e-300, 0.1 + 0.2,
          1 / 3, 12345678901234567890, 4.35, 2 ** 53 + 0.0, 1e22, 0.07, 999999999999999.9, -0.0]
STEPS = [2, 3, 5, 7, 10, 100, 1000, 2 ** 53, 12]
BOUND_KEYWORDS = ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")
# texts tried on every schema: zeros, exponents, past 2**53, 0.1 + 0.2 and its neighbours
GENERIC_TEXTS = [
    "0", "-0", "0.0", "-0.0", "0e0", "1", "1.0", "1e0", "10e-1", "0.1e1", "1e1", "1E+1", "1e-1", "1e400", "-1e400",
    "1e-400", "123456789012345678901234567890", "0.000000000000000000000000000001", "2", "3", "4", "5", "6", "7", "9",
    "12", "100", "1000", "0.5", "1.5", "2.5", "-0.5", "9007199254740993", "9007199254740993.0", "9007199254740992.5",
    "18014398509481985", "1e16", "1.0000000000000001", "0.30000000000000004", "0.3", "0.30000000000000001", "4.35",
    "4.3500000000000001", "435e-2"]


def number_schema(seed: int) -> dict:
    """A number schema: a numeric type (alone or beside string/null), bounds, a step, `not` of values."""
    rng = random.Random(seed)
    s: dict[str, Any] = {"type": rng.choice(["integer", "number", "number", ["integer", "string"], ["number", "null"]])}
    for keyword in BOUND_KEYWORDS:
        if rng.random() < 0.4:
            s[keyword] = rng.choice(BOUNDS)
    if rng.random() < 0.3:
        s["multipleOf"] = rng.choice(STEPS)
    r = rng.random()
    if r < 0.15:
        s["not"] = {"const": rng.choice(BOUNDS)}
    elif r < 0.25:
        s["not"] = {"enum": rng.sample(BOUNDS, 3)}
    elif r < 0.3 and "multipleOf" not in s:
        s["not"] = {"type": "integer"}
        for keyword in BOUND_KEYWORDS:
            s.pop(keyword, None)
    return s


def number_texts(schema: dict) -> list[str]:
    """JSON number texts at and around the schema's bounds, step multiples near them, and `not`'s values."""
    texts = set(GENERIC_TEXTS)
    for keyword in BOUND_KEYWORDS + ("multipleOf",):
        if keyword in schema:
            texts |= _spellings(schema[keyword])
    negated = schema.get("not", {})
    for value in [negated["const"]] if "const" in negated else negated.get("enum", []):
        texts |= _spellings(value)
    step = schema.get("multipleOf")
    for keyword in BOUND_KEYWORDS if step else ():
        if keyword in schema:
            q = int(_decimal(schema[keyword]) / step)
            for j in range(q - 2, q + 3):
                texts |= {str(j * step), f"{j * step}.0"}
    return sorted(texts)


def _decimal(x: int | float) -> Decimal:
    return Decimal(repr(x)) if isinstance(x, float) else Decimal(x)


def _spellings(x: Any) -> set[str]:
    """Texts of numbers at `x` and next to it (by 1, 0.5, 1e-20, and 1e-15..1e-17 of it), in fixed, exponent and
    long spellings."""
    try:
        d = _decimal(x)
    except (InvalidOperation, TypeError, ValueError):  # (not a number: `not`'s values may be anything)
        return set()
    out = set()
    nudges = [Decimal(0), Decimal(1), Decimal(-1), Decimal("0.5"), Decimal("1e-20"), Decimal("-1e-20")]
    nudges += [sign * Decimal(f"1e-{k}") * abs(d) for k in (16, 17) for sign in (1, -1)] + [Decimal("1e-15") * abs(d)]
    for nudge in nudges:
        v = d + nudge
        out |= {format(v, "f"), format(v.normalize(), "E").replace("E+", "e"), format(v, "e")}
    base = format(d, "f")
    point = "" if "." in base else "."
    out |= {base + point + "0000", base + point + "00000000000000000001", base + point + "99999999999999999999"}
    if isinstance(x, float):
        out.add(repr(x))
    return {t for t in out if _is_json_number(t)}


def _is_json_number(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return text[0] in "-0123456789"
