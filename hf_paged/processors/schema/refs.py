"""`$ref` resolution (`$defs`, `definitions`, JSON pointers, `$id`, `$anchor`) and `allOf` as schema merging.

`allOf` is an intersection, not a concatenation (outlines-core 0.2.14 concatenated the branches' regexes).
We merge the branches into one schema keyword by keyword (bounds tighten, `required` unions, `properties`
of the same name become a nested `allOf`, `enum`s intersect, ...); a pair of keywords we cannot merge
exactly is reported as unsupported. Merging is lazy one level deep, so recursive schemas stay finite.
"""

from __future__ import annotations

import math
from typing import Any
from urllib.parse import unquote

from hf_paged.errors import InvalidSchemaError
from hf_paged.processors.schema.contains import PENDING, defer_contains
from hf_paged.processors.schema.context import ANNOTATION_KEYWORDS, Context, pointer_join

__all__ = ["RefTarget", "local_target", "merge_all", "resolve_ref", "same_json"]


class RefTarget:
    """A resolved `$ref`: the sub-schema and its JSON pointer (the pointer keys the recursion count)."""

    __slots__ = ("pointer", "schema")

    def __init__(self, schema: Any, pointer: str) -> None:
        self.schema = schema
        self.pointer = pointer


def _index_ids(node: Any, pointer: str, out: dict[str, RefTarget], ref_overrides: bool = False,
               nested: str | None = None, path: list | None = None) -> None:
    """Index `$id`s and `$anchor`s. `ref_overrides`: drafts up to 7, where a `$ref` makes its siblings (its `$id`
    too) ignored. `nested`: the `$id` of the sub-resource we are in, whose anchors a bare `#name` from the root
    cannot reach (indexed as `<id>#name` instead). A `$dynamicAnchor` is also a plain anchor for `$ref`. `path`:
    the tokens from `pointer` down to `node` (the pointer is spelled only where something is indexed: the walk
    visits every node of the document)."""
    path = [] if path is None else path
    if isinstance(node, dict):
        for key in () if ref_overrides and "$ref" in node else ("$id", "id"):
            v = node.get(key)
            if isinstance(v, str) and v:
                here = pointer_join(pointer, *path)
                out.setdefault(v.rstrip("#"), RefTarget(node, here))
                if here != "#" and not v.startswith("#"):
                    nested = v.rstrip("#")
                    if _has_ref(node):
                        # the references inside it resolve against another base URI: we do not track scopes
                        out[_NESTED_BASE] = RefTarget(v, here)
        for anchor in (node.get("$anchor"), node.get("$dynamicAnchor")):
            if isinstance(anchor, str):
                out.setdefault(f"{nested or ''}#{anchor}", RefTarget(node, pointer_join(pointer, *path)))
        for k, v in node.items():
            if k not in ("enum", "const", "default", "examples") and isinstance(v, (dict, list)):
                path.append(k)
                _index_ids(v, pointer, out, ref_overrides, nested, path)
                path.pop()
    elif isinstance(node, list):
        for i, v in enumerate(node):
            if isinstance(v, (dict, list)):
                path.append(i)
                _index_ids(v, pointer, out, ref_overrides, nested, path)
                path.pop()


_NESTED_BASE = "\x00nested-base"


def _has_ref(node: Any) -> bool:
    """Whether a `$ref` appears anywhere in `node` (outside values: enum, const, default, examples)."""
    if isinstance(node, dict):
        return "$ref" in node or any(_has_ref(v) for k, v in node.items()
                                     if k not in ("enum", "const", "default", "examples"))
    return isinstance(node, list) and any(_has_ref(v) for v in node)


def resolve_ref(ref: Any, ctx: Context, pointer: str) -> RefTarget:
    """Find the target of `ref` inside the root schema; remote documents are unsupported."""
    if not isinstance(ref, str):
        raise ctx.invalid(pointer_join(pointer, "$ref"), f"`$ref` must be a string, got {ref!r}", "fix it")
    ids = _ids(ctx)
    if _NESTED_BASE in ids:
        # `#/...` inside a sub-schema with its own `$id` resolves against that sub-schema, not the root:
        # we do not track scopes, so we refuse rather than risk following the wrong target.
        nested = ids[_NESTED_BASE]
        ctx.unsupported("$id", nested.pointer, f"a nested `$id` ({nested.schema!r}) changes the base URI of "
                        "references; remove nested `$id`s or make them fragments")
    if ref.startswith("#/"):  # a local pointer names the same target from anywhere: resolved once per compile
        found = ctx.resolved.get(ref)
        if found is None:
            found = ctx.resolved[ref] = _resolve(ref, ctx, pointer)
        return found
    return _resolve(ref, ctx, pointer)


def local_target(ref: Any, ctx: Context) -> RefTarget | None:
    """`resolve_ref` for a reference within this document (`#...`), without its errors and warnings: None for any
    other reference, one that does not resolve, or a document whose nested `$id`s change the base URI."""
    if not isinstance(ref, str) or not ref.startswith("#") or _NESTED_BASE in _ids(ctx):
        return None
    try:
        return resolve_ref(ref, ctx, "#")
    except InvalidSchemaError:
        return None


def _ids(ctx: Context) -> dict:
    """The document's `$id`s and anchors (`Context.ref_index`), indexed on the first reference of the compile."""
    if not ctx.ref_index:
        draft = ctx.root.get("$schema") if isinstance(ctx.root, dict) else None
        old_draft = isinstance(draft, str) and any(f"draft-0{n}" in draft for n in (3, 4, 6, 7))
        _index_ids(ctx.root, "#", ctx.ref_index, old_draft)
        ctx.ref_index[""] = RefTarget(ctx.root, "#")  # marks the index as built, even with no $id at all
    return ctx.ref_index


def _resolve(ref: str, ctx: Context, pointer: str) -> RefTarget:
    ids = ctx.ref_index
    base, _, fragment = ref.partition("#")
    if ref.startswith("#") and not ref.startswith("#/") and ref != "#" and ref in ids:
        return ids[ref]
    doc, doc_pointer = ctx.root, "#"
    if base:
        match = ids.get(base) or next((t for k, t in ids.items() if k.endswith("/" + base) or k == base), None)
        root_id = ctx.root.get("$id") or ctx.root.get("id") if isinstance(ctx.root, dict) else None
        if match is None and isinstance(root_id, str) and root_id.rstrip("#").endswith(base):
            match = RefTarget(ctx.root, "#")
        if match is None:
            ctx.unsupported("$ref", pointer, f"reference {ref!r} points outside this schema; inline the target in "
                            "`$defs` and reference it as '#/$defs/...'")
            return RefTarget(True, pointer)
        doc, doc_pointer = match.schema, match.pointer
    node = doc
    path = doc_pointer
    if fragment and not fragment.startswith("/"):
        key = "#" + fragment
        if (not base or doc_pointer == "#") and key in ids:  # the root resource's own anchor
            return ids[key]
        for k, target in ids.items():  # an anchor of the resource `base` names (ids as matched above)
            resource, _, name = k.partition("#")
            if name == fragment and base and (resource == base or resource.endswith("/" + base)):
                return target
        raise ctx.invalid(pointer_join(pointer, "$ref"), f"anchor {ref!r} not found", "define the `$anchor`")
    for raw_token in fragment.split("/")[1:] if fragment else []:
        token = unquote(raw_token).replace("~1", "/").replace("~0", "~")
        if isinstance(node, list) and token.isdigit() and int(token) < len(node):
            node = node[int(token)]
        elif isinstance(node, dict) and token in node:
            node = node[token]
        else:
            raise ctx.invalid(pointer_join(pointer, "$ref"), f"reference {ref!r} does not resolve (no {token!r})",
                              "point it at an existing definition")
        path = pointer_join(path, token)
    return RefTarget(node, path)


# -- allOf ----------------------------------------------------------------------------------------------

MAX_CROSS = 64  # `anyOf` pairs two merged `anyOf` lists may make (`conditionals` keeps to it too)
_MIN_KEYS = ("minLength", "minItems", "minProperties", "minContains")
_MAX_KEYS = ("maxLength", "maxItems", "maxProperties", "maxContains")
_KNOWN = frozenset(
    {
        "type", "enum", "const", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
        "minLength", "maxLength", "pattern", "format", "items", "prefixItems", "additionalItems", "minItems",
        "maxItems", "uniqueItems", "contains", "minContains", "maxContains", "unevaluatedItems", "properties",
        "required", "additionalProperties", "patternProperties", "minProperties", "maxProperties",
        "propertyNames", "dependencies", "dependentRequired", "dependentSchemas", "unevaluatedProperties",
        "allOf", "anyOf", "oneOf", "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
    }
)
_SCHEMA_VALUED = ("additionalProperties", "additionalItems", "contains", "propertyNames", "unevaluatedProperties",
                  "unevaluatedItems")


def merge_all(parts: list[Any], ctx: Context, pointer: str) -> Any:
    """Merge schemas that must all hold into one schema (True / False / dict).

    parts[0] is the parent schema (its siblings of `allOf` / `$ref`), the rest are its in-place children:
    the parent's `unevaluatedProperties` sees what the children evaluate, a child's does not see its siblings'.
    """
    children: Any = True
    for i, part in enumerate(parts[1:], start=1):
        children = _merge(children, part, ctx, pointer_join(pointer, "allOf", i - 1), parent=False)
        if children is False:
            return False
    return _merge(parts[0] if parts else True, children, ctx, pointer, parent=True)


def _merge(a: Any, b: Any, ctx: Context, pointer: str, *, parent: bool = False) -> Any:
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    if not isinstance(a, dict) or not isinstance(b, dict):
        raise ctx.invalid(pointer, f"a schema must be an object or a boolean, got {b!r}", "fix the sub-schema")
    out = dict(a)
    for key, vb in b.items():
        if key == PENDING:
            out[key] = list(out.get(key, [])) + list(vb)
            continue
        if key in ANNOTATION_KEYWORDS or key not in out or key not in _KNOWN:
            out.setdefault(key, vb)  # annotations and unknown keywords: the first one wins (they never restrict)
            continue
        va = out[key]
        if va == vb and same_json(va, vb):  # (Python's == alone takes `const: true` and `const: 1` for one)
            continue
        if key == "contains":
            continue  # (two different ones ask for an item each, not one item of both: `defer_contains` below)
        if key in _MIN_KEYS or key in ("minimum", "exclusiveMinimum") and _numeric(va, vb):
            out[key] = max(va, vb)
        elif key in _MAX_KEYS or key in ("maximum", "exclusiveMaximum") and _numeric(va, vb):
            out[key] = min(va, vb)
        elif key == "required":
            out[key] = list(dict.fromkeys(list(va) + list(vb)))
        elif key == "type":
            ta = {va} if isinstance(va, str) else set(va)
            tb = {vb} if isinstance(vb, str) else set(vb)
            both = ta & tb
            if "number" in ta and "integer" in tb or "integer" in ta and "number" in tb:
                both.add("integer")
            out[key] = sorted(both)
        elif key in ("enum", "const"):
            values_a = [va] if key == "const" else list(va)
            values_b = [vb] if key == "const" else list(vb)
            out.pop(key)
            out["enum"] = [v for v in values_a if any(same_json(v, w) for w in values_b)]
        elif key == "properties":
            props = dict(va)
            for name, sb in vb.items():
                props[name] = {"allOf": [props[name], sb]} if name in props else sb
            out[key] = props
        elif key == "multipleOf" and all(isinstance(v, int) and not isinstance(v, bool) for v in (va, vb)):
            out[key] = va * vb // math.gcd(va, vb)
        elif key in _SCHEMA_VALUED or key == "items" and not isinstance(va, list) and not isinstance(vb, list):
            out[key] = {"allOf": [va, vb]}
        elif key == "not":
            out[key] = {"anyOf": [va, vb]}  # not A and not B == not (A or B)
        elif key == "allOf":
            out[key] = list(va) + list(vb)
        elif key == "$ref":  # two references: resolve the second one later, as an allOf part
            out["allOf"] = list(out.get("allOf", [])) + [{"$ref": vb}]
        elif key in ("anyOf", "oneOf"):
            # (one/any of A) and (one/any of B) == one/any of the pairs allOf(a, b): exact for both keywords.
            if len(va) * len(vb) > MAX_CROSS:
                ctx.unsupported(key, pointer, f"two `{key}` lists under `allOf` would need {len(va) * len(vb)} "
                                "combinations; merge them by hand")
            out[key] = [{"allOf": [x, y]} for x in va for y in vb]
        elif key == "uniqueItems":
            out[key] = bool(va) or bool(vb)
        else:
            ctx.unsupported(key, pointer, f"two different `{key}` values under `allOf` cannot be intersected; "
                            "keep one")
    _scope_items(a, b, out)
    _scope_items(b, a, out)
    if "contains" in out:  # each part's minContains counts its own `contains` (default 1; without one, nothing)
        mins = [p.get("minContains", 1) for p in (a, b) if "contains" in p]
        out["minContains"] = max(m for m in mins if isinstance(m, (int, float))) if mins else 1
    for owner in (b,) if parent else (a, b):
        if owner.get("unevaluatedItems") not in (None, True):
            # A child's unevaluatedItems sees only its own item keywords, not its siblings' ("cousins").
            if "items" not in owner and "prefixItems" not in owner and owner["unevaluatedItems"] is False:
                out["maxItems"] = 0
            elif "items" not in owner:
                ctx.unsupported("unevaluatedItems", pointer, "use `items` in the same schema")
    if isinstance(out.get("properties"), dict) or "properties" in a or "properties" in b:
        out.setdefault("properties", {})
        owners = [(a, "additionalProperties"), (b, "additionalProperties"), (b, "unevaluatedProperties")]
        if not parent:
            owners.append((a, "unevaluatedProperties"))
        for owner, extra_key in owners:
            # A branch's additionalProperties binds names only the other branch declares; so does a later
            # part's unevaluatedProperties, which cannot see its siblings' evaluations.
            extra = owner.get(extra_key, True)
            own = owner.get("properties", {})
            if extra is True or extra == {} or not isinstance(own, dict):
                continue
            props = dict(out["properties"])
            for name in props:
                if name not in own:
                    props[name] = {"allOf": [props[name], extra]} if extra is not False else False
            out["properties"] = props
    _scope_patterns(a, b, out, parent)
    if "contains" in a and "contains" in b and not same_json(a["contains"], b["contains"]):
        defer_contains(a, b, out)
    return out


def _scope_patterns(a: dict, b: dict, out: dict, parent: bool) -> None:
    """A part's additionalProperties (a later part's unevaluatedProperties) binds the keys only the other part's
    `patternProperties` match too: they are not its own. Written as the extra schema under those patterns (stricter
    where a key is also the owner's own name; sound)."""
    owners = [(a, b, "additionalProperties"), (b, a, "additionalProperties"), (b, a, "unevaluatedProperties")]
    if not parent:
        owners.append((a, b, "unevaluatedProperties"))
    for owner, other, extra_key in owners:
        extra = owner.get(extra_key, True)
        theirs = other.get("patternProperties")
        if extra is True or extra == {} or not isinstance(theirs, dict) or not isinstance(out.get("patternProperties"), dict):
            continue
        own = owner.get("patternProperties") or {}
        patterns = dict(out["patternProperties"])
        for pattern in theirs:
            if pattern not in own:
                patterns[pattern] = {"allOf": [patterns[pattern], extra]} if extra is not False else False
        out["patternProperties"] = patterns


def _scope_items(a: dict, b: dict, out: dict) -> None:
    """`items` of a applies to every position, including those b's `prefixItems` describe."""
    items = a.get("items")
    if "prefixItems" not in a and isinstance(b.get("prefixItems"), list) and items not in (None, True) and not isinstance(items, list):
        out["prefixItems"] = [{"allOf": [p, items]} for p in b["prefixItems"]]


def _numeric(a: Any, b: Any) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (a, b))


def same_json(a: Any, b: Any) -> bool:
    """JSON equality: 1 == 1.0, but True != 1, at any depth (Python's `[True] == [1]` holds)."""
    if a is b:
        return True
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_json(v, b[k]) for k, v in a.items())
    if isinstance(a, list):
        return isinstance(b, list) and len(a) == len(b) and all(map(same_json, a, b))
    return a == b
