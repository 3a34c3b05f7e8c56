"""Integers and numbers: JSON number grammar, bounds as finite digit-range alternations, `multipleOf`.

Numbers with bounds are written without exponent (`-?int(.frac)?`), so the bound can be checked digit by
digit. Python's `json` turns a text with a fraction or exponent into a float and `jsonschema` compares that
float, so the decimal bound we compare against is chosen such that float rounding cannot push an accepted
text over the schema's bound:

    upper bound b --> b' = the largest double <= b (< b when exclusive) --> exact decimal of b', rounded down to
    17 significant digits (still rounds to b', and never above it), or, below 2**53, the shortest text of b' where
    that is larger (it rounds to b' too: 0.1, whose exact decimal is 0.1000000000000000055)

An integer bound that is a double (all up to 2**53) is kept exactly. Texts without fraction parse to Python ints,
compared exactly with the bound: for an integer bound, the integers between the decimal bound and the schema's (a
bound no double equals, such as 2**63 - 1; an exclusive one) are added as an exact range.
"""

from __future__ import annotations

import math
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from decimal import Context as DecimalContext
from typing import Any

from hf_paged.processors.schema.context import Context, pointer_join
from hf_paged.processors.schema.digits import DEFAULT_DIGITS, NumberDigits
from hf_paged.processors.schema.fragments import Rx, alt, raw, seq

__all__ = ["INTEGER", "NUMBER", "NumberDigits", "decimal_range", "int_range", "integer_regex", "number_bounds",
           "number_regex", "number_text"]

INTEGER = raw("-?(?:0|[1-9][0-9]*)", atomic=True)
NUMBER = raw("-?(?:0|[1-9][0-9]*)(?:\\.[0-9]+)?(?:[eE][+\\-]?[0-9]+)?", atomic=True)  # JSON's own grammar


def _run(first: str, rest: int | None, lo: int = 0) -> str:
    """`first` then `[0-9]` repeated lo..rest times (unbounded when rest is None)."""
    if rest is None:
        return first + ("[0-9]*" if lo == 0 else "[0-9]+")
    return first + ("" if rest == 0 else f"[0-9]{{{lo},{rest}}}")


def number_text(digits: NumberDigits | None, exponent: bool = True) -> Rx:
    """The unbounded number (`exponent=False`: integer) with `digits`' bounds (None: `DEFAULT_DIGITS`)."""
    d = digits if digits is not None else DEFAULT_DIGITS
    if d == NumberDigits():
        return NUMBER if exponent else INTEGER
    whole = "-?(?:0|" + _run("[1-9]", None if d.integer is None else d.integer - 1) + ")"
    if not exponent:
        return raw(whole, atomic=True) if d.integer is not None else INTEGER
    frac = "(?:\\." + _run("", d.fraction, 1) + ")?"
    exp = "(?:[eE][+\\-]?" + _run("", d.exponent, 1) + ")?"
    return raw(whole + frac + exp, atomic=True)


_MAX_ENUMERATED_MULTIPLES = 256
_MAX_FRACTION_DIGITS = 20  # bounds are rounded inward (stricter) to this many fraction digits


def int_range(lo: int | None, hi: int | None) -> Rx | None:
    """Canonical decimal integers (no leading zeros, no `-0`) in [lo, hi]; None bounds are unbounded."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts: list[Rx | None] = []
    if lo is None or lo < 0:  # negative part: "-" + magnitudes in [max(1, -hi), -lo]
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        mag_hi = None if lo is None else -lo
        parts.append(seq(raw("\\-", atomic=True), _naturals(mag_lo, mag_hi)))
    if hi is None or hi >= 0:
        parts.append(_naturals(max(lo, 0) if lo is not None else 0, hi))
    return alt(parts)


def _naturals(lo: int, hi: int | None) -> Rx | None:
    """Naturals in [lo, hi] written without leading zeros."""
    if hi is not None and lo > hi:
        return None
    parts: list[Rx | None] = []
    n_lo = len(str(lo))
    n_hi = len(str(hi)) if hi is not None else n_lo
    for n in range(n_lo, n_hi + 1):
        a = lo if n == n_lo else 10 ** (n - 1)
        b = hi if hi is not None and n == n_hi else 10**n - 1
        parts.append(raw(_same_length(str(a), str(b))))
    if hi is None:  # every longer number
        parts.append(raw("[1-9][0-9]{%d,}" % n_lo, atomic=True))
    return alt(parts)


def _same_length(a: str, b: str) -> str:
    """Regex for digit strings of len(a) == len(b) between a and b inclusive."""
    if not a:
        return ""
    if a == b:
        return a
    if a[0] == b[0]:
        return a[0] + _group(_same_length(a[1:], b[1:]))
    rest = len(a) - 1
    tail = "[0-9]{%d}" % rest if rest > 1 else "[0-9]" if rest == 1 else ""
    if a[1:] == "0" * rest and b[1:] == "9" * rest:
        return _digits(int(a[0]), int(b[0])) + tail
    parts = [a[0] + _group(_same_length(a[1:], "9" * rest))]
    if int(b[0]) - int(a[0]) > 1:
        parts.append(_digits(int(a[0]) + 1, int(b[0]) - 1) + tail)
    parts.append(b[0] + _group(_same_length("0" * rest, b[1:])))
    return "(?:" + "|".join(parts) + ")"


def _digits(a: int, b: int) -> str:
    return str(a) if a == b else "[%d-%d]" % (a, b)


def _group(text: str) -> str:
    return text if len(text) <= 1 or text.startswith("(?:") and text.endswith(")") else f"(?:{text})"


# -- decimals -------------------------------------------------------------------------------------------


def decimal_range(lo: Decimal | None, hi: Decimal | None, digits: NumberDigits | None = None) -> Rx | None:
    """Numbers `-?int(.frac)?` whose exact decimal value lies in [lo, hi] (inclusive; None: unbounded); `digits`:
    the user's bounds (an unbounded side gets at most `digits.integer` integer digits; every fraction at most
    `digits.fraction` digits)."""
    if lo is not None and hi is not None and lo > hi:
        return None
    parts: list[Rx | None] = []
    if lo is None or lo < 0:  # negatives: magnitudes in (max(0, -hi), -lo], zero excluded ("-0" is not ours)
        m_lo = Decimal(0) if hi is None or hi >= 0 else -hi
        m_hi = None if lo is None else -lo
        parts.append(seq(raw("\\-", atomic=True), _magnitudes(m_lo, m_lo == 0, m_hi, digits)))
    if hi is None or hi >= 0:
        parts.append(_magnitudes(max(lo, Decimal(0)) if lo is not None else Decimal(0), False, hi, digits))
    return alt(parts)


def _magnitudes(lo: Decimal, lo_exclusive: bool, hi: Decimal | None, digits: NumberDigits | None) -> Rx | None:
    """Non-negative `int(.frac)?` texts with value in [lo, hi] (or (lo, hi] when lo_exclusive)."""
    ia, fa = _split(lo)
    n = digits.fraction if digits is not None else None
    if hi is None:
        top = _int_cap(digits)
        top = top if top is not None and top >= ia + 1 else None  # (a schema's own bound above it keeps its meaning)
        return alt([_with_frac(str(ia), _frac(fa, not lo_exclusive, None, n)),
                    _with_any_frac(_naturals(ia + 1, top), n)])
    ib, fb = _split(hi)
    if ia == ib:
        return _with_frac(str(ia), _frac(fa, not lo_exclusive, fb, n))
    return alt(
        [
            _with_frac(str(ia), _frac(fa, not lo_exclusive, None, n)),
            _with_any_frac(_naturals(ia + 1, ib - 1), n),
            _with_frac(str(ib), _frac(None, True, fb, n)),
        ]
    )


def _int_cap(digits: NumberDigits | None) -> int | None:
    """The largest magnitude the user's `digits.integer` allows, or None."""
    return None if digits is None or digits.integer is None else 10**digits.integer - 1


def _split(d: Decimal) -> tuple[int, str]:
    """Integer part and fraction digits (trailing zeros stripped) of a non-negative decimal."""
    text = format(d, "f")
    int_part, _, frac = text.partition(".")
    return int(int_part), frac.rstrip("0")


def _with_any_frac(ints: Rx | None, max_len: int | None = None) -> Rx | None:
    return seq(ints, raw("(?:\\." + _run("", max_len, 1) + ")?", atomic=True)) if ints is not None else None


def _with_frac(int_text: str, frac: tuple[str | None, bool]) -> Rx | None:
    nonempty, empty_ok = frac
    if nonempty is None:
        return raw(int_text) if empty_ok else None
    dot = "\\." + nonempty
    return raw(int_text + (f"(?:{dot})?" if empty_ok else f"(?:{dot})"))


def _frac(a: str | None, a_inclusive: bool, b: str | None, max_len: int | None = None) -> tuple[str | None, bool]:
    """Fraction digit strings s with 0.s >= 0.a (> when not inclusive) and 0.s <= 0.b (inclusive), at most
    `max_len` digits long (None: any length).

    Returns (regex of the non-empty such strings or None, whether the empty fraction -- value 0 -- is in).
    `a`/`b` are digit strings without trailing zeros ("" is zero); None means no bound on that side.
    """
    if a == "" and a_inclusive:
        a = None
    if max_len == 0:
        return None, a is None
    if a is None and b is None:
        return _run("", max_len, 1), True
    if a == "" and b is None:  # strictly positive fraction: some non-zero digit
        if max_len is None:
            return "[0-9]*[1-9][0-9]*", False
        return "(?:" + "|".join("0" * k + _run("[1-9]", max_len - 1 - k) for k in range(max_len)) + ")", False
    if b == "":  # upper bound zero: only zeros, and only if the lower bound allows zero
        return (_run("0", None if max_len is None else max_len - 1).replace("[0-9]", "0"), True) if a is None \
            else (None, False)
    empty_ok = a is None  # value 0 satisfies the lower bound only when there is none (a is non-zero here)
    a0 = int(a[0]) if a else 0
    b0 = int(b[0]) if b is not None else 9
    parts: list[str] = []
    free_lo = a0 + 1 if a is not None else 0
    free_hi = b0 - 1 if b is not None else 9
    if free_lo <= free_hi:
        parts.append(_run(_digits(free_lo, free_hi), None if max_len is None else max_len - 1))
    for d in sorted({a0 if a is not None else -1, b0 if b is not None else -1} - {-1}):
        rest_a = a[1:] if a is not None and d == a0 else None
        rest_b = b[1:] if b is not None and d == b0 else None
        if a is not None and d < a0 or b is not None and d > b0:
            continue
        ne, e = _frac(rest_a, a_inclusive, rest_b, None if max_len is None else max_len - 1)
        if ne is not None:
            parts.append(str(d) + (f"(?:{ne})?" if e else f"(?:{ne})"))
        elif e:
            parts.append(str(d))
    if not parts:
        return None, empty_ok
    return ("(?:" + "|".join(parts) + ")" if len(parts) > 1 else parts[0]), empty_ok


# -- schema keywords ------------------------------------------------------------------------------------


def number_bounds(schema: dict, ctx: Context, pointer: str) -> tuple[Any, bool, Any, bool]:
    """(minimum, min_exclusive, maximum, max_exclusive) across draft-4 and draft-6+ spellings."""
    lo, lo_x, hi, hi_x = schema.get("minimum"), False, schema.get("maximum"), False
    for key in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        v = schema.get(key)
        if v is not None and not isinstance(v, (int, float, bool)):
            raise ctx.invalid(pointer_join(pointer, key), f"`{key}` must be a number, got {v!r}", "fix its value")
    emin, emax = schema.get("exclusiveMinimum"), schema.get("exclusiveMaximum")
    if isinstance(emin, bool):  # draft-04: a flag on `minimum`
        lo_x = emin and lo is not None
    elif emin is not None and (lo is None or emin >= lo):
        lo, lo_x = emin, True
    if isinstance(emax, bool):
        hi_x = emax and hi is not None
    elif emax is not None and (hi is None or emax <= hi):
        hi, hi_x = emax, True
    for v in (lo, hi):
        if isinstance(v, float) and not math.isfinite(v):
            raise ctx.invalid(pointer, f"non-finite bound {v}", "use a finite number")
    return lo, lo_x, hi, hi_x


def _int_bounds(lo: Any, lo_x: bool, hi: Any, hi_x: bool) -> tuple[int | None, int | None]:
    """Exact integer bounds (Python compares int with float exactly, so use the float's exact value)."""
    ilo = ihi = None
    if lo is not None:
        d = Decimal(lo)
        ilo = int(d.to_integral_value(ROUND_CEILING))
        if lo_x and d == ilo:
            ilo += 1
    if hi is not None:
        d = Decimal(hi)
        ihi = int(d.to_integral_value(ROUND_FLOOR))
        if hi_x and d == ihi:
            ihi -= 1
    return ilo, ihi


def _safe_decimal(v: Any, exclusive: bool, upper: bool) -> Decimal | None:
    """The bound of the texts with a fraction, which parse to floats (rounded to the nearest double): the double
    nearest `v` on its inner side (never `v` itself when exclusive), as a decimal rounded inward to 17 significant
    digits, so that every text within it rounds to a double within `v`; None when no finite double lies inside.

    An integer bound that no double equals (past 2**53: 2**63 - 1) is not kept exactly: `9223372036854775806.5`
    parses to 2**63, over it. Integer texts parse to exact Python ints, bounded apart (`number_regex`)."""
    try:
        f = float(v)
    except OverflowError:  # an int beyond the doubles
        f = math.inf if v > 0 else -math.inf
    if f == v and isinstance(v, int) and not exclusive:
        return Decimal(v)  # (a double: every text within it rounds within it; exact, as the integer texts)
    if (f > v if upper else f < v) or (exclusive and f == v):
        f = math.nextafter(f, -math.inf if upper else math.inf)
    if not math.isfinite(f):  # beyond the largest double: no float there
        return None
    ctx = DecimalContext(prec=17, rounding=ROUND_FLOOR if upper else ROUND_CEILING)
    d = ctx.plus(Decimal(f))
    # f's shortest text parses to f as well (0.1's "0.1", where 17 digits gave 0.10000000000000001): the outer of the
    # two; below 2**53, where no integer text (an exact int) lies between them (2**60's is 1152921504606847000)
    if abs(f) < 2**53:
        shortest = Decimal(repr(f))
        d = max(d, shortest) if upper else min(d, shortest)
    if d.as_tuple().exponent < -_MAX_FRACTION_DIGITS:  # e.g. nextafter(0) = 5e-324: round inward, shorter regex
        d = d.quantize(Decimal(1).scaleb(-_MAX_FRACTION_DIGITS), rounding=ROUND_FLOOR if upper else ROUND_CEILING)
    return d


def _multiple(schema: dict, ctx: Context, pointer: str) -> int | None:
    """The integer step of `multipleOf`, or None. Non-integer steps cannot be enforced soundly."""
    m = schema.get("multipleOf")
    if m is None:
        return None
    if isinstance(m, bool) or not isinstance(m, (int, float)) or m <= 0:
        raise ctx.invalid(pointer_join(pointer, "multipleOf"), f"`multipleOf` must be > 0, got {m!r}", "fix it")
    if float(m).is_integer():
        return int(m)
    # jsonschema divides floats (0.07 / 0.01 != 7): only a regex over a finite set could be exact.
    ctx.unsupported("multipleOf", pointer, f"only integer steps are supported, got {m}; use an integer step")
    return None


def integer_regex(schema: dict, ctx: Context, pointer: str) -> Rx | None:
    """Regex of the integers allowed by `minimum`/`maximum`/`exclusive*`/`multipleOf`."""
    lo, hi = _int_bounds(*number_bounds(schema, ctx, pointer))
    step = _multiple(schema, ctx, pointer)
    if lo is not None and hi is not None and lo > hi:
        return ctx.nothing(pointer, f"no integer lies within the minimum / maximum bounds ({lo} > {hi})")
    top = _int_cap(ctx.number_digits)
    if step in (None, 1) and top is not None:  # the user's digit bound on the sides the schema leaves open
        if (lo, hi) == (None, None):
            return number_text(ctx.number_digits, exponent=False)
        lo = -top if lo is None and hi >= -top else lo
        hi = top if hi is None and lo <= top else hi
    return _with_step(lo, hi, step, ctx, pointer)


def _with_step(lo: int | None, hi: int | None, step: int | None, ctx: Context, pointer: str) -> Rx | None:
    if step is None or step == 1:
        return int_range(lo, hi) if (lo, hi) != (None, None) else INTEGER
    if lo is not None and hi is not None:
        first, last = -(-lo // step) * step, (hi // step) * step
        count = (last - first) // step + 1 if last >= first else 0
        if count <= _MAX_ENUMERATED_MULTIPLES:
            return alt(raw(str(v), atomic=True) for v in range(first, last + 1, step))
    suffix = _suffix_rule(step)
    if suffix is not None and lo is None and hi is None:
        return suffix
    if suffix is not None and lo in (0, 1) and hi is None:  # non-negative multiples: drop the sign
        return raw(suffix.text.replace("-?", "", 1)) if lo == 0 else raw(_positive_suffix(step))
    ctx.unsupported(
        "multipleOf", pointer, f"step {step} with these bounds is too large to enumerate; narrow the range"
    )
    return int_range(lo, hi) if (lo, hi) != (None, None) else INTEGER


def _suffix_rule(step: int) -> Rx | None:
    """Multiples of step = 2^a * 5^b are decided by their last max(a, b) digits."""
    k, rest = 0, step
    while rest % 10 == 0:
        rest //= 10
        k += 1
    a = b = 0
    while rest % 2 == 0:
        rest //= 2
        a += 1
    while rest % 5 == 0:
        rest //= 5
        b += 1
    if rest != 1 or max(a, b) + k > 4:
        return None
    n = max(a, b) + k
    tails = [str(v).zfill(n) for v in range(0, 10**n, step)]
    short = [str(v) for v in range(step, 10**n, step)]  # multiples with fewer than n digits, no leading zeros
    body = "(?:0|%s[1-9][0-9]*(?:%s))" % ("".join(v + "|" for v in short), "|".join(tails))  # (10**k: no short)
    return raw("-?" + body)


def _positive_suffix(step: int) -> str:
    rule = _suffix_rule(step)
    assert rule is not None
    return rule.text.replace("-?", "", 1).replace("(?:0|", "(?:", 1)


def number_regex(schema: dict, ctx: Context, pointer: str) -> Rx | None:
    """Regex of the numbers allowed by the bound keywords (no exponent once bounded)."""
    lo, lo_x, hi, hi_x = number_bounds(schema, ctx, pointer)
    step = _multiple(schema, ctx, pointer)
    if step is not None and step != 1:
        ilo, ihi = _int_bounds(lo, lo_x, hi, hi_x)
        return _with_step(ilo, ihi, step, ctx, pointer)  # integer multiples of an integer step
    if step == 1:
        return integer_regex(schema, ctx, pointer)
    if lo is None and hi is None:
        return number_text(ctx.number_digits)
    ilo, ihi = _int_bounds(lo, lo_x, hi, hi_x)  # integer texts: exact Python ints, compared exactly
    dlo = _safe_decimal(lo, lo_x, upper=False) if lo is not None else None  # texts with a fraction: rounded floats
    dhi = _safe_decimal(hi, hi_x, upper=True) if hi is not None else None
    if lo is not None and dlo is None or hi is not None and dhi is None:  # (integers past it: ~309 digits, left out)
        bound = hi if hi is not None and dhi is None else lo
        return ctx.nothing(pointer, f"no double lies beyond the largest one ({bound}, exclusive)")
    if dlo is not None and dhi is not None and dlo > dhi:  # no double within the bounds: integers alone
        if ilo > ihi:  # type: ignore[operator]
            return ctx.nothing(pointer, f"no number lies within the minimum / maximum bounds ({lo} > {hi})")
        return int_range(ilo, ihi)
    parts = [decimal_range(dlo, dhi, ctx.number_digits)]
    # The integers an integer bound allows and the decimal bound leaves out (a bound no double equals, an exclusive
    # one, one past 17 digits): [ilo, ceil(dlo)) and (floor(dhi), ihi]. (Not for a float bound, whose integers were
    # never kept exactly: its 17 digits of a double such as 1.7976931348623157e308 leave out ~300-digit integers,
    # whose range would quadruple the regex.)
    if isinstance(lo, int) and dlo is not None and ilo < (first := int(dlo.to_integral_value(ROUND_CEILING))):
        parts.append(int_range(ilo, first - 1 if ihi is None else min(first - 1, ihi)))
    if isinstance(hi, int) and dhi is not None and ihi > (last := int(dhi.to_integral_value(ROUND_FLOOR))):
        parts.append(int_range(last + 1 if ilo is None else max(last + 1, ilo), ihi))
    return alt(parts)
