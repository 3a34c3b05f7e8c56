"""Several different `contains` under `allOf`: an item for each, as alternatives the translation already writes.

`contains: A` and `contains: B` ask for an item of A and an item of B, not one item of both (which merging them
into `contains: {allOf: [A, B]}` asked for: `[1, "a"]` under `contains: integer` and `contains: string` was refused
as unsatisfiable). The merge keeps the first and defers the others (`defer_contains`, under `PENDING`); once the
branch is merged whole, `resolve_contains` chooses where the matches go, in schema terms, as alternatives:

    all on the same items        contains: {allOf: [A, B, ...]}, minContains: the largest
    each on items of its own     items 0..mA-1 also satisfy A, the next mB items B, ...; and in the reverse order
    the same after the prefix    when the array has positional items already (their own schemas may exclude A, B)

Each is a subset of the valid arrays (sound), as one `contains` on the first items is (`arrays._contains`).
Items are placed with `prefixItems` (draft 2020-12), or tuple `items` + `additionalItems` (earlier drafts): the form
the root's validator reads, since finite values are checked against these schemas with it (`values.py`).
"""

from __future__ import annotations

from typing import Any

from hf_paged.processors.schema.context import Context

__all__ = ["PENDING", "defer_contains", "resolve_contains"]

# The deferred `contains` of a branch being merged ([{contains, minContains?}, ...]): bookkeeping that lives only
# between `defer_contains` and `resolve_contains`, in one `translate.branches` call
PENDING = "x-hf-pending-contains"
_MAX_PLACED = 16  # matching items one alternative places (each is a position of its own)
_TUPLE_DRAFTS = ("draft-03", "draft-04", "draft-06", "draft-07", "2019-09")  # `$schema`s whose tuples are `items`


def defer_contains(a: dict, b: dict, merged: dict) -> None:
    """`merged` (of a and b, whose `contains` differ; their deferred ones already joined) keeps a's `contains` and
    defers b's."""
    merged[PENDING] = list(merged.get(PENDING, [])) + [{k: b[k] for k in ("contains", "minContains", "maxContains")
                                                        if k in b}]
    for key in ("minContains", "maxContains"):  # (each `contains` keeps its own counts)
        merged.pop(key, None)
        if key in a:
            merged[key] = a[key]


def resolve_contains(schema: dict, ctx: Context, pointer: str) -> Any:
    """A merged branch with deferred `contains` as the alternatives of the module docstring (itself without them
    where they cannot be written, after a warning; strict: `UnsupportedSchemaError`)."""
    tests = [{k: schema[k] for k in ("contains", "minContains", "maxContains") if k in schema}] + schema[PENDING]
    rest = {k: v for k, v in schema.items() if k not in ("contains", "minContains", "maxContains", PENDING)}
    needs = [t.get("minContains", 1) for t in tests]
    why = None
    if any("maxContains" in t for t in tests):
        why = "beside `maxContains` (an upper bound on matching items needs negation)"
    elif rest.get("unevaluatedItems") not in (None, True) or "unevaluatedProperties" in rest:
        why = "beside `unevaluatedItems` / `unevaluatedProperties` (which see the items `contains` evaluates)"
    elif not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0 for n in needs) or sum(needs) > _MAX_PLACED:
        why = f"needing more than {_MAX_PLACED} matching items together (each is an item of its own)"
    if why is not None:
        ctx.unsupported("contains", pointer, f"several different `contains` under `allOf` cannot be combined {why}; "
                        "keep one `contains`")
        return {k: v for k, v in schema.items() if k != PENDING}
    tests = [t for t, n in zip(tests, needs) if n > 0]  # (a `contains` that needs no match always holds)
    if len(tests) <= 1:
        return {**rest, **(tests[0] if tests else {})}
    shared = {**rest, "contains": {"allOf": [t["contains"] for t in tests]},
              "minContains": max(t.get("minContains", 1) for t in tests)}
    placed = [t["contains"] for t in tests for _ in range(t.get("minContains", 1))]
    reverse = [t["contains"] for t in reversed(tests) for _ in range(t.get("minContains", 1))]
    key = _positions_key(rest, ctx)
    prefix, _ = _positions(rest, key)
    alternatives = [shared, _placed(rest, placed, 0, key), _placed(rest, reverse, 0, key)]
    if prefix:
        alternatives.append(_placed(rest, placed, len(prefix), key))
    return {"anyOf": alternatives}


def _positions_key(schema: dict, ctx: Context) -> str:
    """Where positional items go: the schema's own form, else the root's draft's."""
    if "prefixItems" in schema:
        return "prefixItems"
    if isinstance(schema.get("items"), list):
        return "items"
    draft = ctx.root.get("$schema") if isinstance(ctx.root, dict) else None
    return "items" if isinstance(draft, str) and any(name in draft for name in _TUPLE_DRAFTS) else "prefixItems"


def _placed(schema: dict, placed: list[Any], start: int, key: str) -> dict:
    """`schema` whose item start + i also satisfies placed[i] (and which has at least that many items)."""
    prefix, after = _positions(schema, key)
    end = start + len(placed)
    positions = [prefix[i] if i < len(prefix) else after for i in range(max(end, len(prefix)))]
    for i, p in enumerate(placed):
        positions[start + i] = {"allOf": [positions[start + i], p]}
    out = {**schema, key: positions, "minItems": max(schema.get("minItems", 0), end)}
    if key == "items":
        out["additionalItems"] = after
    return out


def _positions(schema: dict, key: str) -> tuple[list[Any], Any]:
    """(the schemas of the leading items, the schema of every item after them) as `arrays.array_regex` reads them."""
    items = schema.get("items")
    if key == "prefixItems":
        return list(schema.get("prefixItems", [])), True if items is None else items
    if isinstance(items, list):
        return list(items), schema.get("additionalItems", True)
    return [], True if items is None else items
