"""`oneOf` made sound: each branch is narrowed until none of its documents satisfies another branch.

`oneOf` means exactly one branch matches; a regex alternation only gives "at least one". For every pair of
branches (b, c) we look for a reason no document of b can satisfy c, and narrow b (a subset, still sound)
to create one where the schemas allow it:

    disjoint types / disjoint enum or const                 nothing to narrow
    c finite and none of its values valid under b (or b/c)  nothing to narrow
    arrays whose item types are disjoint                    b keeps at least one item
    b's required keys exceed c's maxProperties (or b closed under c's minProperties)  nothing to narrow
    a property whose enum/const differs in b and c          make it required in b (a discriminator)
    c requires a key that b does not                        forbid that key in b (b objects only)
    c forbids extra keys and b requires one c lacks         nothing to narrow

A pair with no such reason makes the whole `oneOf` unsupported.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hf_paged.processors.schema.refs import same_json

__all__ = ["TYPES", "TYPE_KEYWORDS", "inferred_types", "json_type", "narrow_exclusive", "types_of"]

TYPES = ("null", "boolean", "integer", "number", "string", "array", "object")
TYPE_KEYWORDS = {
    "object": {"properties", "required", "additionalProperties", "patternProperties", "minProperties",
               "maxProperties", "propertyNames", "dependencies", "dependentRequired", "dependentSchemas",
               "unevaluatedProperties"},
    "array": {"items", "prefixItems", "additionalItems", "minItems", "maxItems", "uniqueItems", "contains",
              "minContains", "maxContains", "unevaluatedItems"},
    "string": {"minLength", "maxLength", "pattern"},
    "number": {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"},
}


def inferred_types(s: dict) -> set[str]:
    """Types a schema without `type` is written as: those its keywords constrain (a sound narrowing)."""
    found = {t for t, keys in TYPE_KEYWORDS.items() if keys & s.keys()}
    if isinstance(s.get("format"), str):
        found.add("string")
    if "number" in found:
        found.add("integer")
    return found


def types_of(s: Any, accepted: bool = False) -> set[str]:
    """The JSON types a (flattened) schema can produce; "integer" is included wherever "number" is. `accepted`: the
    types it lets through instead (without `type`, every type: `{"minimum": 2}` accepts any string or object), which
    is what deciding that another branch excludes it needs."""
    if s is True or not isinstance(s, dict):
        return set(TYPES) if s is not False else set()
    t = s.get("type")
    types = ({t} if isinstance(t, str) else set(t) if isinstance(t, list)
             else set(TYPES) if accepted or "const" in s or "enum" in s  # (values are written whatever their type)
             else inferred_types(s) or set(TYPES))
    for values in ([s["const"]] if "const" in s else None, s.get("enum")):
        if isinstance(values, list):
            found = {json_type(v) for v in values}
            if "integer" in found:  # (an integer value is a number too)
                found.add("number")
            types &= found
    if "number" in types:
        types.add("integer")
    return types


def json_type(v: Any) -> str:
    """The JSON type of a value ("integer" for integral numbers, 1.0 included)."""
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, int) or isinstance(v, float) and v.is_integer():
        return "integer"
    if isinstance(v, float):
        return "number"
    return {str: "string", list: "array", dict: "object"}.get(type(v), "object")


def _values(s: Any) -> list[Any] | None:
    """A finite superset of the values `s` allows (its own or an `allOf` part's enum/const), or None."""
    if not isinstance(s, dict):
        return None
    if "const" in s:
        return [s["const"]]
    if isinstance(s.get("enum"), list):
        return list(s["enum"])
    for part in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
        found = _values(part)
        if found is not None:
            return found
    return None


# `check(values, schema) -> bool`: True when the root's jsonschema validator (its draft, references resolved
# against the root) rejects every value under `schema`; False when it cannot tell
NoneValid = Callable[[list[Any], Any], bool]


def _count_bounds_exclude(b: dict, c: dict) -> bool:
    """No object of b has a property count c allows: b requires more than c's maxProperties, or b is closed with
    fewer properties than c's minProperties."""
    req_b = set(b.get("required", []))
    if isinstance(c.get("maxProperties"), int) and len(req_b) > c["maxProperties"]:
        return True
    closed = b.get("additionalProperties") is False and not b.get("patternProperties")
    return closed and isinstance(c.get("minProperties"), int) and len(set(b.get("properties", {})) | req_b) < c["minProperties"]


def _disjoint(a: list[Any], b: list[Any]) -> bool:
    return not any(same_json(x, y) for x in a for y in b)


def _narrow(b: dict, c: Any, none_valid: NoneValid, types_c: set[str] | None = None) -> dict | None:
    """b narrowed so that no document of it satisfies c; None when no rule applies. `types_c`: c's accepted types, when
    the caller has it."""
    types_b = types_of(b)  # (b is the same throughout: its types once)
    if c is False or not (types_b & (types_of(c, accepted=True) if types_c is None else types_c)):
        return b
    if not isinstance(c, dict):
        return None
    vb, vc = _values(b), _values(c)
    if vb is not None and vc is not None and _disjoint(vb, vc):
        return b
    if vc is not None and none_valid(vc, b) or vb is not None and none_valid(vb, c):
        return b  # a finite side none of whose values the other side accepts
    items_b, items_c = b.get("items"), c.get("items")
    if (types_b == {"array"} and isinstance(items_b, dict) and isinstance(items_c, dict)
            and "prefixItems" not in b and "prefixItems" not in c  # (else `items` skips the first items)
            and not (types_of(items_b) & types_of(items_c, accepted=True))):
        # only the empty array can satisfy both: b's arrays keep at least one item
        return b if b.get("minItems", 0) >= 1 else dict(b, minItems=1)
    objects_only = types_b == {"object"}
    props_b, props_c = b.get("properties", {}), c.get("properties", {})
    if not (isinstance(props_b, dict) and isinstance(props_c, dict)):
        return None
    for name, sb in props_b.items():  # a discriminator: same property, disjoint values
        tb, tc = _values(sb), _values(props_c.get(name))
        if objects_only and tb is not None and tc is not None and _disjoint(tb, tc):
            return dict(b, required=list(dict.fromkeys(list(b.get("required", [])) + [name])))
    if not objects_only:
        return None
    if _count_bounds_exclude(b, c) or _count_bounds_exclude(c, b):
        return b
    req_b, req_c = list(b.get("required", [])), list(c.get("required", []))
    if c.get("additionalProperties") is False and not c.get("patternProperties"):
        if any(r not in props_c for r in req_b):
            return b
    for r in req_c:  # c needs a key b may leave out: leave it out always
        if r not in req_b:
            return dict(b, properties={**props_b, r: False})
    return None


def narrow_exclusive(options: list[list[Any]], none_valid: NoneValid,
                     others: list[list[Any]] | None = None) -> list[list[Any]] | None:
    """Narrow every flattened branch of every `oneOf` option against all branches of the other options.

    `others`: the branches as the other options see them, where they differ from `options` (a branch cut off by
    the recursion limit is False in `options`, left out of the output, but still excluded from its siblings' as the
    schema it stands for: documents deeper than the limit satisfy it all the same).
    """
    others = options if others is None else others
    out: list[list[Any]] = []
    types: dict[tuple[int, int], set[str]] = {}  # (option, branch) -> its `types_of`, once (every other branch reads it)
    for i, subs in enumerate(options):
        narrowed = []
        for b in subs:
            if b is False:
                continue
            if b is True or not isinstance(b, dict):
                b = {}
            for j, theirs in enumerate(others):
                if j == i:
                    continue
                for k, c in enumerate(theirs):
                    types_c = types.get((j, k))
                    if types_c is None and c is not False:
                        types_c = types[j, k] = types_of(c, accepted=True)
                    nb = _narrow(b, c, none_valid, types_c)
                    if nb is None:
                        return None
                    b = nb
            narrowed.append(b)
        out.append(narrowed)
    return out
