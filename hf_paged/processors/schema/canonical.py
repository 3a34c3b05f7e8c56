"""`canonical_json`: write an instance the way `schema_to_regex` spells documents, to test regexes on data.

The regex fixes what JSON leaves free: object keys come in the schema's `properties` order (then `required`
names, then other keys in the instance's order), separators are compact, numbers are positional decimals
(integral floats written as integers), strings are `json.dumps(ensure_ascii=False)`. Where a schema has
alternatives (`anyOf`, `oneOf`, `$ref` + siblings...), the first branch the instance validates against
(per `jsonschema`) decides the key order, as the regex of that branch does.
"""

from __future__ import annotations

import warnings
from typing import Any

from hf_paged.errors import HfPagedError
from hf_paged.processors.schema.context import Context, pointer_join
from hf_paged.processors.schema.fragments import json_string
from hf_paged.processors.schema.objects import key_matches, member_order
from hf_paged.processors.schema.refs import same_json
from hf_paged.processors.schema.translate import branches, translate
from hf_paged.processors.schema.values import dump_value

__all__ = ["canonical_json", "serialize"]


def canonical_json(schema: dict | bool, instance: Any) -> str | None:
    """Write `instance` the way `schema_to_regex(schema)` spells it (for benchmarks and tests)."""
    return serialize(schema, instance)


def serialize(schema: Any, instance: Any) -> str | None:
    """Canonical text of `instance` under `schema`, or None when it has no JSON text (NaN, infinity)."""
    ctx = Context(root=schema, strict=False, translate=translate)
    validator = None
    if isinstance(schema, dict):
        import jsonschema

        try:
            validator = jsonschema.validators.validator_for(schema)(schema)
        except Exception:  # noqa: BLE001 -- an odd schema only loses the branch choice
            validator = None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return _write(schema, instance, ctx, validator, "#", 0)


def _pick(schema: Any, instance: Any, ctx: Context, validator: Any, pointer: str) -> Any:
    try:
        options = branches(schema, ctx, pointer)
    except HfPagedError:
        return schema if isinstance(schema, dict) else True
    valid = []
    for b in options:
        if isinstance(b.schema, bool) or validator is None:
            valid.append(b.schema)
            break
        try:
            if validator.evolve(schema=b.schema).is_valid(instance):
                valid.append(b.schema)
        except Exception:  # noqa: BLE001 -- unresolvable refs, bad patterns: try the next branch
            continue
    # objects: a branch that declares every key the instance has, since the regex gives an object with declared
    # properties those keys first (and only those with `undeclared_keys=False`), undeclared ones after them
    # (one that names them all before one that is merely open: its key order is the one the regex follows)
    if isinstance(instance, dict):
        for accept in (_names_all, _open):
            for s in valid:
                if accept(s, instance):
                    return s
    return valid[0] if valid else options[0].schema if options else True


def _names_all(s: Any, x: dict) -> bool:
    if not isinstance(s, dict):
        return s is True
    props = s.get("properties") if isinstance(s.get("properties"), dict) else {}
    required = s.get("required") if isinstance(s.get("required"), list) else []
    return all(k in props or k in required for k in x)


def _open(s: Any, x: dict) -> bool:
    return not isinstance(s, dict) or "patternProperties" in s or s.get("additionalProperties", False) is not False


def _write(schema: Any, x: Any, ctx: Context, validator: Any, pointer: str, depth: int) -> str | None:
    if depth > 64:
        return dump_value(x)
    s = _pick(schema, x, ctx, validator, pointer) if not isinstance(schema, bool) else schema
    if not isinstance(s, dict):
        return dump_value(x)
    for values in ([s["const"]] if "const" in s else None, s.get("enum") if isinstance(s.get("enum"), list) else None):
        if values:
            for v in values:
                if same_json(v, x) and _deep_same(v, x):
                    return dump_value(v)  # the regex spells enum members in their own key order
    if isinstance(x, dict):
        return _write_object(s, x, ctx, validator, pointer, depth)
    if isinstance(x, list):
        return _write_array(s, x, ctx, validator, pointer, depth)
    return dump_value(x)


def _deep_same(a: Any, b: Any) -> bool:
    """Equality that also tells booleans from numbers inside containers."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_deep_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_deep_same(u, v) for u, v in zip(a, b))
    return same_json(a, b)


def _write_object(s: dict, x: dict, ctx: Context, validator: Any, pointer: str, depth: int) -> str | None:
    props = s.get("properties", {}) if isinstance(s.get("properties"), dict) else {}
    required = [r for r in s.get("required", []) if isinstance(r, str)] if isinstance(s.get("required"), list) else []
    order = member_order(props, required)
    keys = [k for k in order if k in x] + [k for k in x if k not in order]
    patterns = s.get("patternProperties", {}) if isinstance(s.get("patternProperties"), dict) else {}
    members = []
    for k in keys:
        parts = [props[k]] if k in props else []
        for pat, sub in patterns.items():
            try:
                if key_matches(pat, k, pointer):
                    parts.append(sub)
            except HfPagedError:
                continue
        if not parts:
            parts.append(s.get("additionalProperties", True))
        sub_schema = parts[0] if len(parts) == 1 else {"allOf": parts}
        text = _write(sub_schema, x[k], ctx, validator, pointer_join(pointer, "properties", k), depth + 1)
        if text is None:
            return None
        members.append(json_string(k) + ":" + text)
    return "{" + ",".join(members) + "}"


def _write_array(s: dict, x: list, ctx: Context, validator: Any, pointer: str, depth: int) -> str | None:
    items = s.get("items")
    prefix = s.get("prefixItems") if isinstance(s.get("prefixItems"), list) else items if isinstance(items, list) else []
    rest = items if "prefixItems" in s or not isinstance(items, list) else s.get("additionalItems", True)
    out = []
    for i, v in enumerate(x):
        sub = prefix[i] if i < len(prefix) else (rest if rest is not None else True)
        text = _write(sub, v, ctx, validator, pointer_join(pointer, "items", i), depth + 1)
        if text is None:
            return None
        out.append(text)
    return "[" + ",".join(out) + "]"
