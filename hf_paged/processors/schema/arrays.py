"""Arrays: `prefixItems` / tuple `items`, `items` / `additionalItems`, `minItems`/`maxItems`, `contains`,
`uniqueItems` (over a small finite item set).

    \\[ ws  P0 ( ws,ws P1 ( ws,ws R (ws,ws R){lo-1,hi-1} )? )?  ws \\]
          prefix items nest, so item i+1 only after item i      the rest repeat, counted

`contains` is placed on items that can hold it: one match at any of the first few positions that can (the
`prefixItems` ones and the first after them), or `minContains` matches on the earliest positions that can (a sound
subset: an array whose matches sit elsewhere is not produced; a schema is refused as unsatisfiable only when no
position can hold a match, where no array can).
`uniqueItems` cannot be checked by a regex in general; when every item comes from a finite set of at most
a few dozen values, we write each value at most once, in the set's order, which is unique by construction;
otherwise (and when at most one item is required) arrays hold at most one item, with the pruning warning.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from hf_paged.processors.schema.context import Context, pointer_join
from hf_paged.processors.schema.fragments import Rx, alt, lit, opt, raw, rep, seq
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
    if max_items is not None and min_items > max_items:
        return ctx.nothing(pointer, f"minItems {min_items} > maxItems {max_items}")
    memo: dict[tuple[int, int], tuple[Any, Rx | None]] = {}  # (the item kept: its id stays its own)

    def value(i: int, item: Any) -> Rx | None:  # (placements share most items, and `_contains` probes some first)
        if (i, id(item)) not in memo:
            memo[i, id(item)] = item, ctx.value(item, pointer_join(pointer, "prefixItems", i))
        return memo[i, id(item)][1]

    placements = _contains(schema, prefix_schemas, rest, min_items, max_items, value, ctx, pointer)
    if not placements:
        return ctx.nothing(pointer, "no item the array may hold can match `contains`")
    ws = raw(ctx.whitespace) if ctx.whitespace else Rx("", 0)
    sep = seq(ws, raw("\\,", atomic=True), ws)
    assert sep is not None
    if schema.get("uniqueItems") is True and (max_items is None or max_items > 1):
        first = placements[0]
        body = _unique(first.items, rest, first.min_items, max_items, sep, ctx, pointer, canonical)
    else:
        values = [[value(i, item) for i, item in enumerate(p.items)] for p in placements]
        rest_rx = None if rest is False else ctx.value(rest, pointer_join(pointer, "items"))
        bodies = [_sequence(v, rest_rx, p.min_items, ctx.cap(max_items, p.min_items), sep)
                  for v, p in zip(values, placements)]
        body = alt(bodies)
        if ctx.prune_cost is not None and body is not None and body.cost > ctx.prune_cost and len(placements) > 1:
            body = bodies[0]  # the earliest placement alone (a subset, as a pruned anyOf branch)
            ctx.num_pruned += 1
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


@dataclass(slots=True)
class _Placement:
    """Where `contains` matches sit in one alternative: the item schemas at positions 0.. (`prefixItems`, the matches
    folded into their positions' schemas; past the prefix, `items` and the match), and the least item count."""

    items: list[Any]
    min_items: int


_MAX_PLACEMENTS = 4  # positions one `contains` match may take in one regex (each a copy of the array's text)


def _contains(schema: dict, prefix: list[Any], rest: Any, min_items: int, max_items: int | None,
              value: Callable[[int, Any], Rx | None], ctx: Context, pointer: str) -> list[_Placement]:
    """Where `contains` matches go: with one match (`minContains` 1, the default), each of the earliest
    `_MAX_PLACEMENTS` positions whose item can match (the `prefixItems` ones, then the first after them), one
    alternative each; with more, the earliest `minContains` positions that can. `[]` when none can (then no array
    satisfies the schema, or none within `maxItems`). `value(i, item)`: an item's translation at position i."""
    need = int(schema.get("minContains", 1)) if "contains" in schema else 0
    if "maxContains" in schema and "contains" in schema:
        ctx.unsupported("maxContains", pointer, "an upper bound on matching items needs negation; remove it")
    if need <= 0:
        return [_Placement(list(prefix), min_items)]
    n = len(prefix)
    placed = [{"allOf": [base, schema["contains"]]} for base in [*prefix, rest]]  # (the last: any item past them)
    can: list[int] = []  # positions that can hold a match, probed in order until enough are found
    for i, item in enumerate(placed):
        if len(can) >= (_MAX_PLACEMENTS if need == 1 else need):
            break
        if value(i, item) is not None:
            can.append(i)
    if need == 1:
        choices = [[i] for i in can[:_MAX_PLACEMENTS]]
    else:  # every position past the prefix can hold a match, or none can
        positions = [i for i in can if i < n] + (list(range(n, n + need)) if n in can else [])
        choices = [positions[:need]] if len(positions) >= need else []
    out = []
    for chosen in choices:
        count = max(min_items, chosen[-1] + 1)
        if max_items is None or count <= max_items:
            items = list(prefix) + [placed[n]] * (chosen[-1] + 1 - n)  # (past the prefix, every position chosen)
            for i in chosen:
                items[i] = placed[min(i, n)]
            out.append(_Placement(items, count))
    return out


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


