"""`if` / `then` / `else` as alternatives the translation already handles: `(if and then) or (not-if and else)`.

A schema's own conditional and those of its `allOf` parts become `anyOf` parts (`expand_conditionals`), which
`translate.branches` distributes as any `anyOf`. `not-if` is written as positive schemas (`negate`) for the
conditions real schemas use: `type`, `required`, `const` / `enum`, `properties` of those, number / length bounds,
`not`, `allOf`, `anyOf`. Several conditionals on one property's values (`if: {properties: {kind: {const: "a"}}}`,
one per kind: the common way to write a tagged union) become one alternative per value of that property, not
2^n. A condition we cannot negate stays in place and the translation refuses it as before (`UnsupportedSchemaError`).
The same negation writes a `oneOf` whose options may overlap (`exactly_one`): each option and not the others.

Schemas with `unevaluatedProperties` / `unevaluatedItems` are left alone: those see what `if` evaluates only when it
holds, which a merged alternative cannot tell.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from hf_paged.processors.schema.context import ANNOTATION_KEYWORDS
from hf_paged.processors.schema.oneof import TYPE_KEYWORDS, TYPES
from hf_paged.processors.schema.refs import MAX_CROSS, same_json
from hf_paged.processors.schema.values import finite_domain

__all__ = ["exactly_one", "expand_conditionals", "has_conditionals", "negate"]

_CONDITIONAL = ("if", "then", "else")
_MAX_NEGATED = 64  # alternatives one negation may write (`anyOf` negates into a product)
_DRAFT4_FLAGS = ("exclusiveMinimum", "exclusiveMaximum")
_BOUNDS = {  # keyword -> (type it binds, the keyword of its negation, how the bound moves)
    "minimum": ("number", "exclusiveMaximum", 0), "exclusiveMinimum": ("number", "maximum", 0),
    "maximum": ("number", "exclusiveMinimum", 0), "exclusiveMaximum": ("number", "minimum", 0),
    "minLength": ("string", "maxLength", -1), "maxLength": ("string", "minLength", 1),
    "minItems": ("array", "maxItems", -1), "maxItems": ("array", "minItems", 1),
    "minProperties": ("object", "maxProperties", -1), "maxProperties": ("object", "minProperties", 1),
}


def expand_conditionals(schema: Any) -> Any:
    """`schema` with its conditionals (its own, and those of its `allOf` parts) as `anyOf` parts of its `allOf`;
    `schema` itself when it has none we can rewrite."""
    if not isinstance(schema, dict):
        return schema
    parts = schema.get("allOf")
    if not has_conditionals(schema, parts if isinstance(parts, list) else []):
        return schema  # (the common case, first: nothing conditional)
    if "unevaluatedProperties" in schema or "unevaluatedItems" in schema or finite_domain(schema) is not None:
        return schema  # (a finite domain's values are checked against the whole schema, `if` included)
    found: list[tuple[Any, Any, Any]] = []
    rest, kept = _split(schema, found), []
    for part in parts if isinstance(parts, list) else []:
        if _conditional(part) and "unevaluatedProperties" not in part and "unevaluatedItems" not in part:
            part = _split(part, found)
        if part != {}:
            kept.append(part)
    alternatives, left = _rewrite(found, _listed_types(schema.get("type", list(TYPES))) or set(TYPES))
    if not alternatives and len(left) == len(found):
        return schema  # nothing rewritten: as it was (the translation names the `if` it refuses)
    for condition, then, otherwise in left:
        kept.append({"if": condition, "then": then, "else": otherwise})
    rest.pop("allOf", None)
    return {**rest, "allOf": kept + [{"anyOf": options} for options in alternatives]}


def has_conditionals(schema: dict, parts: list) -> bool:
    """Whether `schema` or one of its `allOf` `parts` has `if`, `then` or `else` (cheap: checked on every merge)."""
    return _conditional(schema) or any(_conditional(p) for p in parts)


def _conditional(schema: Any) -> bool:
    return isinstance(schema, dict) and ("if" in schema or "then" in schema or "else" in schema)


def _split(schema: dict, found: list) -> dict:
    """`schema` without its conditional, which goes to `found` when it has an `if` and a `then` or an `else`
    (without `if` they do nothing; an `if` alone does nothing either)."""
    if "if" in schema and ("then" in schema or "else" in schema):
        found.append((schema["if"], schema.get("then", True), schema.get("else", True)))
    return {k: v for k, v in schema.items() if k not in _CONDITIONAL}


def _rewrite(found: list, types: set[str]) -> tuple[list[list[Any]], list]:
    """(one list of alternatives per rewritten group of conditionals, the conditionals left as they were); `types`:
    those the schema around them allows."""
    by_name: dict[str, list] = {}
    alternatives, left, combined = [], [], 1
    for condition, then, otherwise in found:
        tag = _tag(condition)
        if tag is not None:
            by_name.setdefault(tag[0], []).append((tag[1], tag[2], then, otherwise, condition))
            continue
        negated = negate(condition)
        holds = _holds(condition, types)
        if negated is None or combined * (len(negated) + len(holds)) > MAX_CROSS:
            left.append((condition, then, otherwise))
            continue
        alternatives.append([_all([h, then]) for h in holds] + [_all([n, otherwise]) for n in negated])
        combined *= len(negated) + len(holds)
    for name, tests in by_name.items():
        options = _tagged(name, [test[:4] for test in tests])
        if combined * len(options) > MAX_CROSS:
            left.extend((test[4], test[2], test[3]) for test in tests)
            continue
        alternatives.append(options)
        combined *= len(options)
    return alternatives, left


def _holds(condition: Any, types: set[str]) -> list[Any]:
    """Schemas whose union holds exactly where `condition` does among values of `types`, each of them typed where
    `condition` is not.

    A keyword of one type holds for every value of the others (`{minLength: 1}` holds for `[100]`), but the
    translation reads a schema without `type` as its keywords' types (`translate._allowed_types`): `condition` alone
    as the `then` case would leave those values to the `else` case, which excludes them (`negate` writes the negation
    typed). So the types `condition` holds for wholly are their own case, and `condition` is kept to the others."""
    whole = _holds_wholly(condition) & types
    if not whole or whole == types:
        return [condition] if not whole else [True]
    rest = [t for t in TYPES if t not in whole]
    return [{"type": [t for t in TYPES if t in whole]}, _all([condition, {"type": rest}])]


def _listed_types(value: Any) -> set[str] | None:
    """The types a `type` keyword's value allows (an integer is a number); None when it is not a list of names."""
    listed = [value] if isinstance(value, str) else value
    if not isinstance(listed, list) or not all(isinstance(t, str) for t in listed):
        return None
    return set(listed) & set(TYPES) | ({"integer"} if "number" in listed else set())


def _holds_wholly(schema: Any) -> set[str]:
    """The JSON types every value of which satisfies `schema` (a subset where unsure: keywords other than type-bound
    ones, `type`, `allOf` and `anyOf` count as holding for none)."""
    if schema is True or schema == {}:
        return set(TYPES)
    if not isinstance(schema, dict):
        return set()
    out = set(TYPES)
    for key, value in schema.items():
        if key in ANNOTATION_KEYWORDS:
            continue
        bound = {t for t, keys in TYPE_KEYWORDS.items() if key in keys} | ({"string"} if key == "format" else set())
        if bound:
            out -= bound | ({"integer"} if "number" in bound else set())
        elif key == "type" and _listed_types(value) is not None:
            out &= _listed_types(value)  # type: ignore[operator]
        elif key in ("allOf", "anyOf") and isinstance(value, list) and value:
            found = [_holds_wholly(part) for part in value]
            out &= set.intersection(*found) if key == "allOf" else set.union(*found)
        else:
            return set()
    return out


def _tag(condition: Any) -> tuple[str, list[Any], bool] | None:
    """(name, values, required) of `{properties: {name: {const | enum}}, required?: [name]}`; None otherwise."""
    if not isinstance(condition, dict):
        return None
    keys = set(condition) - ANNOTATION_KEYWORDS
    props, required = condition.get("properties"), condition.get("required", [])
    if not keys <= {"properties", "required"} or not isinstance(props, dict) or len(props) != 1:
        return None
    (name, sub), = props.items()
    if not isinstance(sub, dict) or required not in ([], [name]):
        return None
    sub_keys = set(sub) - ANNOTATION_KEYWORDS
    if sub_keys == {"const"}:
        return name, [sub["const"]], bool(required)
    if sub_keys == {"enum"} and isinstance(sub["enum"], list):
        return name, list(sub["enum"]), bool(required)
    return None


def _tagged(name: str, tests: list[tuple[list[Any], bool, Any, Any]]) -> list[Any]:
    """Conditionals that each test property `name` against values: one alternative per case of that property
    (a non-object: every condition holds; absent: those without `required` hold; each tested value; any other
    value: none holds), with each conditional's `then` or `else` for that case."""
    values: list[Any] = []
    for listed, _, _, _ in tests:
        values.extend(v for v in listed if not any(same_json(v, w) for w in values))

    def case(head: dict, holds) -> Any:
        return _all([head] + [then if holds(listed, required) else otherwise
                              for listed, required, then, otherwise in tests])

    out = [case({"type": [t for t in TYPES if t != "object"]}, lambda listed, required: True),
           case({"type": "object", "properties": {name: False}}, lambda listed, required: not required)]
    for value in values:
        out.append(case({"type": "object", "required": [name], "properties": {name: {"const": value}}},
                        lambda listed, required, value=value: any(same_json(value, v) for v in listed)))
    out.append(case({"type": "object", "required": [name], "properties": {name: {"not": {"enum": values}}}},
                    lambda listed, required: False))
    return out


def exactly_one(options: list[Any], resolve: Callable[[Any], Any]) -> list[Any] | None:
    """`oneOf: options` whose options may overlap, as one schema per option that holds where that option holds and
    no other does: `option and not-other and ...` (False where another option never fails); None when an option
    cannot be negated (`resolve` gives the schema a bare `$ref` names) or one option would need more than
    `MAX_CROSS` alternatives."""
    negated = []
    for option in options:
        found = negate(resolve(option))
        if found is None:
            return None
        negated.append(found)
    out: list[Any] = []
    for i, option in enumerate(options):
        others = [found for j, found in enumerate(negated) if j != i]
        if any(not found for found in others):
            out.append(False)  # (another option holds everywhere: this one never holds alone)
            continue
        if math.prod(len(found) for found in others) > MAX_CROSS:
            return None
        out.append(_all([option] + [found[0] if len(found) == 1 else {"anyOf": found} for found in others]))
    return out


def _all(parts: list[Any]) -> Any:
    kept = [p for p in parts if p is not True and p != {}]
    if any(p is False for p in kept):
        return False
    return kept[0] if len(kept) == 1 else {"allOf": kept} if kept else True


def negate(schema: Any) -> list[Any] | None:
    """Schemas whose union holds exactly where `schema` fails (an empty list: it never fails); None when we cannot
    write them."""
    if schema is True or schema == {}:
        return []
    if schema is False:
        return [True]
    if not isinstance(schema, dict) or any(isinstance(schema.get(k), bool) for k in _DRAFT4_FLAGS):
        return None  # (draft 4's flags make `minimum` / `maximum` depend on them: not negated keyword by keyword)
    out: list[Any] = []
    for key, value in schema.items():
        if key in ANNOTATION_KEYWORDS:
            continue
        part = _negate_keyword(key, value)
        if part is None or len(out) + len(part) > _MAX_NEGATED:
            return None
        out.extend(part)
    return out


def _negate_keyword(key: str, value: Any) -> list[Any] | None:
    if key == "type":
        listed = [value] if isinstance(value, str) else value
        if not isinstance(listed, list) or not all(t in TYPES for t in listed):
            return None
        if "integer" in listed and "number" not in listed:
            return [{"not": {"type": listed}}]  # (the non-integer numbers: `not` of a type is translated exactly)
        others = [t for t in TYPES if t not in listed and not (t == "integer" and "number" in listed)]
        return [{"type": others}] if others else []
    if key == "required" and isinstance(value, list) and all(isinstance(n, str) for n in value):
        return [{"type": "object", "properties": {name: False}} for name in dict.fromkeys(value)]
    if key == "const":
        return [{"not": {"enum": [value]}}]
    if key == "enum" and isinstance(value, list):
        return [{"not": {"enum": value}}]
    if key == "properties" and isinstance(value, dict):
        out = []
        for name, sub in value.items():
            negated = negate(sub)
            if negated is None:
                return None
            out.extend({"type": "object", "required": [name], "properties": {name: n}} for n in negated)
        return out
    if key in _BOUNDS and isinstance(value, (int, float)) and not isinstance(value, bool):
        kind, opposite, shift = _BOUNDS[key]
        if shift and (not float(value).is_integer() or value + shift < 0):
            return None if not float(value).is_integer() else []  # (a negative length: never fails)
        return [{"type": kind, opposite: value + shift if shift else value}]
    if key == "not":
        return [value]
    if key == "allOf" and isinstance(value, list):
        out = []
        for part in value:
            negated = negate(part)
            if negated is None:
                return None
            out.extend(negated)
        return out
    if key == "anyOf" and isinstance(value, list):
        product: list[Any] = [True]
        for part in value:
            negated = negate(part)
            if negated is None or len(product) * len(negated) > _MAX_NEGATED:
                return None
            product = [_all([p, n]) for p in product for n in negated]
        return [p for p in product if p is not False]
    return None
