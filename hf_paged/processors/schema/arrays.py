"""Arrays: `prefixItems` / tuple `items`, `items` / `additionalItems`, `minItems`/`maxItems`, `contains`,
`uniqueItems` (over a small finite item set).

    \\[ ws  P0 ( ws,ws P1 ( ws,ws R (ws,ws R){lo-1,hi-1} )? )?  ws \\]
          prefix items nest, so item i+1 only after item i      the rest repeat, counted

`contains` is enforced on the first items (a sound subset: an array whose match sits later is not produced).
`uniqueItems` cannot be checked by a regex in general; when every item comes from a finite set of at most
a few dozen values, we write each value at most once, in the set's order, which is unique by construction;
otherwise (and when at most one item is required) arrays hold at most one item, with the pruning warning.
"""

from __future__ import annotations

import re
from typing import Any

from hf_paged.processors.schema.context import Context, pointer_join
from hf_paged.processors.schema.fragments import Rx, lit, opt, raw, rep, seq
from hf_paged.processors.schema.objects import ordered_members

__all__ = ["array_regex"]

_MAX_UNIQUE_VALUES = 32


def array_regex(schema: dict, ctx: Context, pointer: str, canonical: Any) -> Rx | None:
    """Regex of the JSON arrays allowed by the array keywords of `schema`.

    `canonical(value) -> str` writes an enum value the way the translator writes it (for `uniqueItems`).
    """
    items = schema.get("items")
    prefix_schemas: list[Any]
    if "prefixItems" in schema:
        prefix_schemas = list(schema["prefixItems"])
        rest = items if items is not None else True
    elif isinstance(items, list):  # draft <= 2019: tuple form
        prefix_schemas = list(items)
        rest = schema.get("additionalItems", True)
    else:
        prefix_schemas = []
        rest = items if items is not None else True
    if schema.get("unevaluatedItems") not in (None, True):
        if schema["unevaluatedItems"] is not False:
            ctx.unsupported("unevaluatedItems", pointer, "only `false` is supported; use `items`")
        if items is None and "additionalItems" not in schema:
            rest = False
    min_items = int(schema.get("minItems", 0))
    max_items = schema.get("maxItems")
    max_items = None if max_items is None else int(max_items)
    prefix_schemas, rest, min_items = _contains(schema, prefix_schemas, rest, min_items, ctx, pointer)
    if max_items is not None and min_items > max_items:
        return ctx.nothing(pointer, f"minItems {min_items} > maxItems {max_items}")
    ws = raw(ctx.whitespace) if ctx.whitespace else Rx("", 0)
    sep = seq(ws, raw("\\,", atomic=True), ws)
    assert sep is not None
    if schema.get("uniqueItems") is True and (max_items is None or max_items > 1):
        body = _unique(prefix_schemas, rest, min_items, max_items, sep, ctx, pointer, canonical)
    else:
        prefix = [ctx.value(s, pointer_join(pointer, "prefixItems", i)) for i, s in enumerate(prefix_schemas)]
        rest_rx = None if rest is False else ctx.value(rest, pointer_join(pointer, "items"))
        body = _sequence(prefix, rest_rx, min_items, ctx.cap(max_items, min_items), sep)
    return ctx.check_cost(seq(raw("\\[", atomic=True), ws, body, ws, raw("\\]", atomic=True)), pointer)


def _sequence(prefix: list[Rx | None], rest: Rx | None, lo: int, hi: int | None, sep: Rx) -> Rx | None:
    """Comma-separated items: prefix[i] at position i, then `rest`, lo..hi items in all."""
    n = len(prefix)

    def tail_after(count: int, first: bool) -> Rx | None:
        """Items from position `count` on (count >= n), written after `count` items."""
        r_lo = max(0, lo - count)
        r_hi = None if hi is None else hi - count
        if r_hi is not None and r_hi <= 0 or rest is None:
            return Rx("", 0) if r_lo == 0 else None
        if first:
            body = seq(rest, rep(seq(sep, rest), max(r_lo - 1, 0), None if r_hi is None else r_hi - 1))
            return body if r_lo > 0 else opt(body)
        return rep(seq(sep, rest), r_lo, r_hi)

    def from_position(i: int) -> Rx | None:
        """Items at positions i.. (i < n), the item at i being present."""
        if hi is not None and i >= hi:
            return None
        here = prefix[i]
        if i + 1 == n:
            after = tail_after(n, first=False)
        else:
            nxt = from_position(i + 1)
            more = seq(sep, nxt) if nxt is not None else None
            after = more if i + 1 < lo else opt(more) if more is not None else (Rx("", 0) if i + 1 >= lo else None)
        return seq(here, after)

    if n == 0:
        return tail_after(0, first=True)
    first = from_position(0)
    return first if lo > 0 else opt(first) if first is not None else Rx("", 0)


def _contains(schema: dict, prefix: list[Any], rest: Any, min_items: int, ctx: Context, pointer: str):
    """Put `contains` on the first `minContains` items (default 1)."""
    if "contains" not in schema:
        return prefix, rest, min_items
    if "maxContains" in schema:
        ctx.unsupported("maxContains", pointer, "an upper bound on matching items needs negation; remove it")
    need = int(schema.get("minContains", 1))
    contains = schema["contains"]
    prefix = list(prefix)
    for i in range(need):
        base = prefix[i] if i < len(prefix) else rest
        if i < len(prefix):
            prefix[i] = {"allOf": [base, contains]}
        else:
            prefix.append({"allOf": [base, contains]})
    return prefix, rest, max(min_items, need)


def _unique(prefix: list[Any], rest: Any, lo: int, hi: int | None, sep: Rx, ctx: Context, pointer: str,
            canonical: Any) -> Rx | None:
    values = _finite_values(rest, ctx, pointer, canonical) if not prefix else None
    if values is None and lo <= 1 and len(prefix) <= 1:
        # A regex cannot compare items; a single item is unique by itself. A subset of the valid arrays (counted
        # as left out, so the caller warns), where refusing would leave the user nothing.
        ctx.num_pruned += 1
        first = prefix[0] if prefix else rest
        item = None if first is False else ctx.value(first, pointer_join(pointer, "prefixItems" if prefix else "items"))
        return opt(item) if lo == 0 else item
    if values is None:
        ctx.unsupported("uniqueItems", pointer, "uniqueness is only enforced when items come from a small "
                        "`enum`/`const`/boolean set or arrays hold at most one item; add `maxItems: 1` or an "
                        "`enum` to `items`")
        prefix_rx = [ctx.value(s, pointer_join(pointer, "prefixItems", i)) for i, s in enumerate(prefix)]
        rest_rx = None if rest is False else ctx.value(rest, pointer_join(pointer, "items"))
        return _sequence(prefix_rx, rest_rx, lo, ctx.cap(hi, lo), sep)
    elements: list[tuple[Rx | None, bool]] = [(lit(v), False) for v in values]
    return ordered_members(elements, sep, lo, hi, lambda k: Rx("", 0) if k >= lo else None, ctx, pointer)


def _finite_values(rest: Any, ctx: Context, pointer: str, canonical: Any) -> list[str] | None:
    """Canonical texts of every value `rest` allows, when that set is small and known; else None."""
    if not isinstance(rest, dict):
        return None
    candidates: list[Any] | None = None
    if "const" in rest:
        candidates = [rest["const"]]
    elif isinstance(rest.get("enum"), list):
        candidates = list(rest["enum"])
    elif rest.get("type") == "boolean":
        candidates = [False, True]
    elif rest.get("type") == "null":
        candidates = [None]
    if candidates is None or len(candidates) > _MAX_UNIQUE_VALUES:
        return None
    item_rx = ctx.sub(rest, pointer_join(pointer, "items"))
    if item_rx is None:
        return []
    texts: list[str] = []
    kept: list[Any] = []
    for v in candidates:
        if any(v == w for w in kept):  # equal JSON values (1 == 1.0, key order): keep one, never both
            continue
        kept.append(v)
        text = canonical(v)
        if text is not None and text not in texts and re.fullmatch(item_rx.text, text):
            texts.append(text)
    return texts


