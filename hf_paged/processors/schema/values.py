"""Finite value sets of the JSON-Schema translation: which values a schema allows when there are few of them, exact
checks of values against (sub-)schemas with jsonschema, and how the translator spells a value as JSON text.

A schema whose documents form a small finite set (an `enum`/`const`, or a bounded integer range beside keywords a
regex cannot express) is translated as the alternation of the candidates that jsonschema accepts: exact, whatever
the sibling keywords, and it needs no regex for `not`, `if` or `multipleOf`.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from hf_paged.processors.schema.context import ANNOTATION_KEYWORDS, Context
from hf_paged.processors.schema.fragments import Rx, alt, json_string, lit

__all__ = ["dump_value", "finite_domain", "finite_regex", "valid_values"]

_MAX_FINITE_INTEGERS = 4096  # integers of a bounded range tried one by one against the whole schema
_FEW_MULTIPLES = 256  # `numbers` writes up to this many multiples of a step itself
_NEEDS_VALUES = ("not", "if", "multipleOf")  # keywords a finite domain checks exactly where regexes cannot


def finite_domain(schema: dict) -> list[Any] | None:
    """The candidate values of a schema whose documents form a small finite set: its `enum`/`const`, or a bounded
    integer range beside keywords our regexes cannot pin down (`not`, `if`, `multipleOf`). Each candidate is then
    checked against the whole schema by jsonschema, so the alternation is exact (sound and complete), whatever
    the sibling keywords (`maxLength` beside a numeric enum does not make it a string)."""
    if "enum" in schema and isinstance(schema["enum"], list):
        return list(schema["enum"])
    if "const" in schema:
        return [schema["const"]]
    if not any(k in schema for k in _NEEDS_VALUES):
        return None
    t = schema.get("type")
    step = schema.get("multipleOf")
    integral = t in ("integer", ["integer"]) or (
        t in ("number", ["number"]) and isinstance(step, int) and not isinstance(step, bool) and step > 0)
    if not integral:
        return None
    lows = [schema.get(k) for k in ("minimum", "exclusiveMinimum")]
    highs = [schema.get(k) for k in ("maximum", "exclusiveMaximum")]
    lows = [v for v in lows if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    highs = [v for v in highs if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)]
    if not lows or not highs:
        return None
    lo, hi = math.floor(max(lows)), math.ceil(min(highs))  # a superset: jsonschema decides each value exactly
    stride = step if isinstance(step, int) and not isinstance(step, bool) and step > 0 else 1
    first = -(-lo // stride) * stride  # valid integers are multiples of an integer step: only those are candidates
    if hi < first or (hi - first) // stride + 1 > _MAX_FINITE_INTEGERS:
        return None if hi >= first else []
    if "not" not in schema and "if" not in schema and (hi - first) // stride + 1 <= _FEW_MULTIPLES:
        return None  # a plain bounded `multipleOf`: the number translation enumerates it without jsonschema
    return list(range(first, hi + 1, stride))


def finite_regex(values: list[Any], schema: Any, ctx: Context) -> Rx | None:
    """The alternation of the `values` that satisfy `schema` (`valid_values`), memoised by content for the compile
    (`Context.finite`: a long enum repeated in several places, or met again by a later try, is written once)."""
    key = _content_key(values, schema)
    found = None if key is None else ctx.finite.get(key)
    if found is None:
        found = (alt(lit(t) for t in (dump_value(v) for v in valid_values(values, schema, ctx, key)) if t is not None),)
        if key is not None:
            ctx.finite[key] = found
    return found[0]


def _content_key(values: list[Any], schema: Any) -> str | None:
    try:
        return json.dumps([schema, values], sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # (values JSON cannot spell: check them, unmemoised)
        return None


_UNKNOWN = "?"  # `valid_values`' key not made yet


def valid_values(values: list[Any], schema: Any, ctx: Context, key: str | None = _UNKNOWN) -> list[Any]:
    """The `values` that satisfy `schema` per jsonschema (references resolve against the root); each value is one
    of the budget's `checks`. Memoised across the ladder's tries (`Context.checked`, keyed by content, `key` when the
    caller made it: the same enum beside the same keywords is checked once per compile)."""
    if key is _UNKNOWN:
        key = _content_key(values, schema)
    if key is not None and key in ctx.checked:
        return [values[i] for i in ctx.checked[key]]
    ctx.budget.spend("checks", len(values))
    try:
        check = _type_check(schema, values)
        if check is None:
            import jsonschema  # (~90 ms to import: not for the enums of plain types most schemas have)

            if ctx.validator is None:
                root = ctx.root if isinstance(ctx.root, dict) else {}
                ctx.validator = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)(root)
            check = _simple_check(ctx.validator, schema)
            if check is None:
                check = ctx.validator.evolve(schema=schema).is_valid
        kept = [i for i, v in enumerate(values) if check(v)]
        if key is not None:
            ctx.checked[key] = kept
        return [values[i] for i in kept]
    except Exception as exc:
        raise ctx.invalid("#", f"cannot check values against the schema ({exc})", "fix the sub-schema") from exc


_TYPE_OF = {str: "string", bool: "boolean", type(None): "null", list: "array", dict: "object", int: "integer",
            float: "number"}  # (a value's JSON type by its Python class, as json.loads makes them)


def _type_check(schema: Any, values: list[Any]) -> Callable[[Any], bool] | None:
    """jsonschema's verdict for a schema of a `type` and annotations only, in plain Python: what every draft's type
    checker says (an integer is a number; a bool is no integer). None for any other schema, and where drafts differ:
    draft 3's "any", an integral float beside "integer" (draft 6 on counts 1.0 in, drafts 3 and 4 do not)."""
    if not isinstance(schema, dict) or not all(k == "type" or k in ANNOTATION_KEYWORDS for k in schema):
        return None
    listed = schema.get("type", list(_ALL_TYPES))
    listed = [listed] if isinstance(listed, str) else listed
    if not isinstance(listed, list) or not all(isinstance(t, str) and t in _ALL_TYPES for t in listed):
        return None  # (draft 3's "any" and schemas in `type`, a name no draft knows: jsonschema decides)
    names = set(listed) | ({"integer"} if "number" in listed else set())
    if not all(type(v) in _TYPE_OF for v in values):
        return None
    if "integer" in names and "number" not in names and any(type(v) is float and v.is_integer() for v in values):
        return None
    return lambda value: _TYPE_OF[type(value)] in names


_ALL_TYPES = frozenset(_TYPE_OF.values())


def _simple_check(validator: Any, schema: Any) -> Callable[[Any], bool] | None:
    """`validator.evolve(schema=schema).is_valid`, without the evolve (~50 us a check, most of a real schema's
    value checks), for the schemas that most checks meet: `type`, `const`, `enum` and keywords the validator's draft
    does not know (annotations, `x-*`), which it skips. The same keyword functions run, as `iter_errors` runs them,
    and none of them reads the validator's schema. None for any other schema (evolve and check as before)."""
    if not isinstance(schema, dict):
        return None
    known = validator.VALIDATORS
    checks = []
    for keyword, value in schema.items():
        function = known.get(keyword)
        if function is None:
            continue  # (a keyword this draft does not know: `iter_errors` skips it too)
        if keyword not in _SIMPLE or (keyword == "type" and not _type_names(value)):
            return None
        checks.append((function, value))

    def is_valid(instance: Any) -> bool:
        return all(next(iter(function(validator, value, instance, schema) or ()), None) is None
                   for function, value in checks)

    return is_valid


_SIMPLE = frozenset({"type", "const", "enum"})  # keywords whose check reads only the instance and its value


def _type_names(value: Any) -> bool:
    """Whether a `type` value names types only (draft 3 also allows schemas in it, which would descend)."""
    return isinstance(value, str) or (isinstance(value, list) and all(isinstance(t, str) for t in value))


def dump_value(value: Any) -> str | None:
    """Compact JSON of a value in our number format (positional decimals, integral floats as ints)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        if value.is_integer():
            return str(int(value))
        from decimal import Decimal

        return format(Decimal(repr(value)), "f")
    if isinstance(value, str):
        return json_string(value)
    if isinstance(value, list):
        items = [dump_value(v) for v in value]
        return None if None in items else "[" + ",".join(items) + "]"  # type: ignore[arg-type]
    if isinstance(value, dict):
        members = [(json_string(k), dump_value(v)) for k, v in value.items()]
        return None if any(v is None for _, v in members) else "{" + ",".join(f"{k}:{v}" for k, v in members) + "}"
    return None
