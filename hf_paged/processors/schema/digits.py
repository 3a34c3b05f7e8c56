"""`NumberDigits`: bounds on the digits of a JSON number, and the default the schema translation uses."""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["DEFAULT_DIGITS", "NumberDigits"]


@dataclass(frozen=True, slots=True)
class NumberDigits:
    """Most digits in each part of a JSON number (None: no bound): `integer` digits before the point, `fraction`
    digits after it, `exponent` digits after the `e`. A bound the user asks for applies to every number of the
    schema; a side the schema bounds itself (`minimum`/`maximum`) keeps the schema's meaning."""

    integer: int | None = None
    fraction: int | None = None
    exponent: int | None = None

    def __post_init__(self) -> None:
        for name in ("integer", "fraction", "exponent"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"NumberDigits.{name} must be an int >= 1 or None, got {value!r}")


# The default (`number_digits=None`): bounds only what no value needs. Every finite double has a text with at most
# 17 significant digits and a 3-digit exponent (e-324..e+308); 23 fraction digits hold what JavaScript's
# `Number.prototype.toString` writes without an exponent (6 leading zeros + 17 digits; Python's `repr`, 20), so
# where an exponent may follow (numbers without bounds) no double value is lost, and a model cannot run away in
# fraction or exponent digits. Integer digits stay unbounded: JSON integers are exact (Python's `int`), and any
# bound would refuse some. Numbers with `minimum`/`maximum` are written without exponent and left as they are.
DEFAULT_DIGITS = NumberDigits(integer=None, fraction=23, exponent=3)
