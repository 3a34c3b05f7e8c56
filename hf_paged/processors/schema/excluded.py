"""`not` of values: `not: {const: v}`, `not: {enum: [...]}` (or an `anyOf` of them, as `allOf` merges several `not`s)
beside a schema that has no `enum` of its own. Each type's regex leaves out the listed values of that type:
booleans and `null` by name, numbers by splitting their range at each excluded number, strings through a trie of the
excluded texts. Where a regex cannot leave a value out (an excluded array or object the schema allows, an excluded
string beside `pattern`/`format`/lengths) the translation refuses it (`Context.unsupported`).

What `if`/`then`/`else` turns into (`conditionals.py`) needs this: "the property is not the discriminator value".
"""

from __future__ import annotations

from typing import Any

from hf_paged.processors.schema.context import ANNOTATION_KEYWORDS, Context
from hf_paged.processors.schema.fragments import Rx, alt, class_char, lit, raw, seq
from hf_paged.processors.schema.key_names import bare_char
from hf_paged.processors.schema.numbers import number_bounds
from hf_paged.processors.schema.oneof import json_type
from hf_paged.processors.schema.strings import ANY_CHAR, FORMATS, PLAIN
from hf_paged.processors.schema.values import valid_values

__all__ = ["MAX_EXCLUDED_LENGTH", "excluded_values", "leave_out"]

MAX_EXCLUDED_LENGTH = 64  # longest string `not` may leave out (the trie recurses once per character)


def excluded_values(neg: Any) -> list[Any] | None:
    """The values `not: neg` excludes when `neg` lists values only (`const`, `enum`, an `anyOf` of those); None
    for any other `neg`."""
    clauses = neg.get("anyOf") if isinstance(neg, dict) and set(neg) - ANNOTATION_KEYWORDS == {"anyOf"} else [neg]
    if not isinstance(clauses, list) or not clauses:
        return None
    out: list[Any] = []
    for clause in clauses:
        if not isinstance(clause, dict):
            return None
        keys = set(clause) - ANNOTATION_KEYWORDS
        if keys == {"const"}:
            out.append(clause["const"])
        elif keys == {"enum"} and isinstance(clause["enum"], list):
            out.extend(clause["enum"])
        else:
            return None
    return out


def leave_out(kind: str, schema: dict, values: list[Any], build, ctx: Context, pointer: str) -> Rx | None:
    """The regex of type `kind` (`translate._plain`'s names) of `schema` without its `not`, less `values`.

    `build(schema)` writes that type's regex of a schema (the translation's own). Only the excluded values the
    schema allows matter (checked by jsonschema, as enums are)."""
    rest = {k: v for k, v in schema.items() if k != "not"}
    mine = [v for v in values if json_type(v) == kind or kind in ("number", "non-integer") and json_type(v) == "integer"]
    if mine:
        mine = valid_values(mine, rest, ctx)
    if not mine:
        return build(rest)
    if kind == "null":
        return None
    if kind == "boolean":
        return alt(lit(text) for text, value in (("true", True), ("false", False))
                   if not any(v is value for v in mine))
    if kind in ("integer", "number", "non-integer"):
        return alt(build(piece) for piece in _pieces(rest, sorted(set(mine)), ctx, pointer))
    if kind == "string" and max(map(len, mine)) > MAX_EXCLUDED_LENGTH:
        ctx.unsupported("not", pointer, f"a string of more than {MAX_EXCLUDED_LENGTH} characters cannot be left out "
                        "(its trie is written one level per character); list the allowed values in an `enum` instead")
        return build(rest)
    if kind == "string" and not any(k in rest for k in ("pattern", "minLength", "maxLength")) \
            and rest.get("format") not in FORMATS:  # (a format we do not enforce is an annotation)
        return string_not_in(mine)
    ctx.unsupported("not", pointer, f"leaving {len(mine)} {kind} value(s) out of this {kind} schema needs a regex "
                    "we cannot build; list the allowed values in an `enum` instead")
    return build(rest)


def _pieces(schema: dict, cuts: list[Any], ctx: Context, pointer: str) -> list[dict]:
    """`schema`'s numbers between consecutive `cuts` (each cut left out), with the schema's own bounds kept."""
    lo, lo_x, hi, hi_x = number_bounds(schema, ctx, pointer)
    bare = {k: v for k, v in schema.items() if k not in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum")}
    out = []
    for below, above in zip([None, *cuts], [*cuts, None]):
        low = _tighter_low(lo, lo_x, below)
        high = _tighter_high(hi, hi_x, above)
        piece = dict(bare)
        if low is not None:
            piece["exclusiveMinimum" if low[1] else "minimum"] = low[0]
        if high is not None:
            piece["exclusiveMaximum" if high[1] else "maximum"] = high[0]
        out.append(piece)
    return out


def _tighter_low(lo: Any, exclusive: bool, cut: Any) -> tuple[Any, bool] | None:
    if cut is None:
        return None if lo is None else (lo, exclusive)
    if lo is None or cut >= lo:
        return cut, True
    return lo, exclusive


def _tighter_high(hi: Any, exclusive: bool, cut: Any) -> tuple[Any, bool] | None:
    if cut is None:
        return None if hi is None else (hi, exclusive)
    if hi is None or cut <= hi:
        return cut, True
    return hi, exclusive


# -- strings --------------------------------------------------------------------------------------------------------

_SHORT_ESCAPES = {'"': '\\\\"', "\\": "\\\\\\\\", "/": "\\\\/", "\b": "\\\\b", "\f": "\\\\f", "\n": "\\\\n",
                  "\r": "\\\\r", "\t": "\\\\t"}  # a character -> its short escape, as regex text


def string_not_in(values: list[str]) -> Rx:
    """JSON strings (with quotes) whose value is none of `values`.

    Texts of bare characters walk a trie of the values: they leave it on a character no value has there (then go
    on freely) or stop where no value ends. A text with a short escape of a character no value contains is none of
    them either, whatever else it holds. Texts that spell a value's character with an escape otherwise (`\\u0041`
    for `A`) are left out: a subset of the strings, all of them valid."""
    names = sorted(set(values))
    leave, short = _trie(tuple(names))
    bare = alt([None if leave is None else seq(leave, raw(PLAIN + "*")), short])
    used = {c for name in names for c in name}
    escapes = [text for c, text in _SHORT_ESCAPES.items() if c not in used]
    quote = raw('"', atomic=True)
    parts = [None if bare is None else seq(quote, bare, quote)]
    if escapes:
        units = raw(ANY_CHAR.text + "*")
        parts.append(seq(quote, units, raw("(?:" + "|".join(escapes) + ")", atomic=True), units, quote))
    out = alt(parts)
    assert out is not None, "the strings outside a finite set are never none"
    return out


def _trie(suffixes: tuple[str, ...]) -> tuple[Rx | None, Rx | None]:
    """(texts that leave the trie at this node or below, each before its free tail; texts that end here or below
    where no value ends), over bare characters."""
    kids: dict[str, list[str]] = {}
    ends = False
    for suffix in suffixes:
        if suffix:
            kids.setdefault(suffix[0], []).append(suffix[1:])
        else:
            ends = True
    holes = "".join(class_char(ord(c)) for c in kids if bare_char(c))
    leave: list[Rx | None] = [raw(PLAIN[:-1] + holes + "]", atomic=True)]  # a bare character no value has here
    short: list[Rx | None] = [] if ends else [Rx("", 0)]
    for c, below in kids.items():
        if bare_char(c):  # (a kid only an escape spells: no bare text goes on below it)
            below_leave, below_short = _trie(tuple(below))
            leave.append(None if below_leave is None else seq(lit(c), below_leave))
            short.append(None if below_short is None else seq(lit(c), below_short))
    return alt(leave), alt(short)

