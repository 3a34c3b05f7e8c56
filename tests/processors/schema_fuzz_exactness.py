"""Where the schema compiler may refuse a valid value by design, for the completeness check of the schema fuzz
(`schema_fuzz_check.py`).

The compiler writes a sound subset of the valid documents wherever an exact regex would be too large or cannot be
written; each subset below is documented beside the code that writes it (README, "Constrained decoding"). A valid
value that none of them covers must be accepted in its canonical spelling (`canonical_json`): a refusal there is a
bug (`if` conditions read as types, a float `minimum` refusing its own text). Where a subset applies, the fuzz
checks soundness, and that a schema refused as unsatisfiable has no valid value (how `contains` beside `prefixItems`
and several `contains` under `allOf` showed).
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["refusal_expected"]

# Keywords whose translation is a documented subset (anywhere in the schema: a sub-schema's subset is its parent's)
SUBSET_KEYWORDS = {
    "format": "formats are spelled by regexes stricter than jsonschema's checks (strings.py; some formats it "
              "does not check without optional packages)",
    "uniqueItems": "unique arrays of a finite item set are written in the set's order (arrays.py)",
    "contains": "matches take the earliest positions that can hold one (contains.py)",
    "patternProperties": "undeclared keys are drawn from the patterns, only where no declared name is (objects.py)",
    "propertyNames": "undeclared keys only where none could spell a declared name (objects.py)",
    "dependentRequired": "the names it requires are written as declared members, which canonical_json does not "
                         "order first (name_rules.py)",
    "dependentSchemas": "as dependentRequired",
    "minProperties": "undeclared keys count toward it once (objects.py)",
}
# Type keywords: a sub-schema with one of these and no `type` is read as asking for their types (translate.py)
TYPE_KEYWORDS = {"properties", "required", "additionalProperties", "minProperties", "maxProperties",
                 "patternProperties", "propertyNames", "dependentRequired", "dependentSchemas", "items", "prefixItems",
                 "contains", "minItems", "maxItems", "uniqueItems", "minContains", "maxContains", "minLength",
                 "maxLength", "pattern", "format", "minimum", "maximum", "multipleOf", "exclusiveMinimum",
                 "exclusiveMaximum"}
_SCHEMA_MAPS = ("properties", "patternProperties", "$defs", "dependentSchemas")
_SCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SCHEMA_VALUES = ("items", "additionalProperties", "contains", "then", "else", "propertyNames")
# A string of printable ASCII without `"` or `\`: counted strings and free values leave out the escapes `\"`,
# `\\` and `\uXXXX` (strings.py), undeclared keys are printable ASCII, and a `pattern`'s classes read non-ASCII
# characters as ECMA-262 does, where jsonschema uses Python's `re` (`\w` and "é")
_PLAIN = re.compile(r"[ !#-\[\]-~]*")
_MAX_DIGITS = 15  # `not: {type: integer}` (and the negated `if: {type: integer}`) writes at most 15 significant
# digits and no exponent (non_integers.py); canonical_json spells tiny floats with all their zeros, past the 23
# fraction digits of an unbounded number (digits.py)


def refusal_expected(schema: Any, value: Any) -> str | None:
    """Why the compiler may refuse the valid `value` of `schema` (a documented subset), or None when it must
    accept it."""
    keywords = {k for sub in _subschemas(schema, conditions=True) for k, v in sub.items() if v is not False}
    for keyword, why in SUBSET_KEYWORDS.items():
        if keyword in keywords:
            return f"{keyword}: {why}"
    if "pattern" in keywords and keywords & {"minLength", "maxLength"}:  # (in one schema, or merged by allOf/$ref)
        return "pattern beside a length: intersected as a sound subset (pattern.fit_length)"
    for sub in _subschemas(schema, conditions=False):
        if "type" not in sub and TYPE_KEYWORDS & sub.keys():
            return "a schema without `type` is read as its keywords' types"
    for item in _scalars(value):
        if isinstance(item, str) and not _PLAIN.fullmatch(item):
            return "a string with escapes or non-ASCII characters"
        if isinstance(item, float) and not _short(item):
            return f"a number of more than {_MAX_DIGITS} digits, or with an exponent"
    return None


def _subschemas(schema: Any, conditions: bool):
    """`schema` and every sub-schema in it; with `conditions`, those under `if` and `not` too (a condition is
    never read as a type: it holds for every value of the types its keywords do not bind)."""
    if not isinstance(schema, dict):
        return
    yield schema
    for key, sub in schema.items():
        if key in _SCHEMA_MAPS and isinstance(sub, dict):
            for each in sub.values():
                yield from _subschemas(each, conditions)
        elif key in _SCHEMA_LISTS and isinstance(sub, list):
            for each in sub:
                yield from _subschemas(each, conditions)
        elif key in _SCHEMA_VALUES or (conditions and key in ("if", "not")):
            yield from _subschemas(sub, conditions)


def _scalars(value: Any):
    """Every key and scalar in `value`."""
    if isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _scalars(item)
    elif isinstance(value, list):
        for item in value:
            yield from _scalars(item)
    else:
        yield value


def _short(x: float) -> bool:
    text = json.dumps(x)
    return "e" not in text and len(text.lstrip("-").replace(".", "").lstrip("0")) <= _MAX_DIGITS
