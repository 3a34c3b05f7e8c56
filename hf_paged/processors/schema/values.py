"""Finite value sets of the JSON-Schema translation: which values a schema allows when there are few of them, exact
checks of values against (sub-)schemas with jsonschema, and how the translator spells a value as JSON text.

A schema whose documents form a small finite set (an `enum`/`const`, or a bounded integer range beside keywords a
regex cannot express) is translated as the alternation of the candidates that jsonschema accepts: exact, whatever
the sibling keywords, and it needs no regex for `not`, `if` or `multipleOf`.
"""

from __future__ import annotations

import json
import math
from typing import Any

from hf_paged.processors.schema.context import Context

__all__ = ["dump_value", "finite_domain", "valid_values"]

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


def valid_values(values: list[Any], schema: Any, ctx: Context) -> list[Any]:
    """The `values` that satisfy `schema` per jsonschema (references resolve against the root); each value is one
    of the budget's `checks`. Memoised across the ladder's tries (`Context.checked`, keyed by content: the same
    enum beside the same keywords is checked once per compile)."""
    import jsonschema

    try:
        key = json.dumps([schema, values], sort_keys=True, allow_nan=False)
    except (TypeError, ValueError):  # (values JSON cannot spell: check them, unmemoised)
        key = None
    if key is not None and key in ctx.checked:
        return [values[i] for i in ctx.checked[key]]
    ctx.budget.spend("checks", len(values))
    try:
        if ctx.validator is None:
            root = ctx.root if isinstance(ctx.root, dict) else {}
            ctx.validator = jsonschema.validators.validator_for(root, default=jsonschema.Draft202012Validator)(root)
        validator = ctx.validator.evolve(schema=schema)
        kept = [i for i, v in enumerate(values) if validator.is_valid(v)]
        if key is not None:
            ctx.checked[key] = kept
        return [values[i] for i in kept]
    except Exception as exc:
        raise ctx.invalid("#", f"cannot check values against the schema ({exc})", "fix the sub-schema") from exc


def dump_value(value: Any) -> str | None:
    """Compact JSON of a value in our number format (positional decimals, integral floats as ints)."""
    if value is None or isinstance(value, bool):
        return json.dumps(value)
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
        return json.dumps(value, ensure_ascii=False)
    if isinstance(value, list):
        items = [dump_value(v) for v in value]
        return None if None in items else "[" + ",".join(items) + "]"  # type: ignore[arg-type]
    if isinstance(value, dict):
        members = [(json.dumps(k, ensure_ascii=False), dump_value(v)) for k, v in value.items()]
        return None if any(v is None for _, v in members) else "{" + ",".join(f"{k}:{v}" for k, v in members) + "}"
    return None
