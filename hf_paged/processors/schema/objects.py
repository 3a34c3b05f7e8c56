"""Objects: properties in schema order, `required`, `additionalProperties`, `patternProperties`,
`propertyNames`, `min/maxProperties`, `dependentRequired`/`dependentSchemas`/`dependencies`.

Layout of the regex (ws = the whitespace regex):

    \\{ ws  [ "p1" ws : ws v1 ]  [ ws , ws "p2" ws : ws v2 ] ...  [ ws , ws extra-key ws : ws v ]*  ws \\}
            declared names in schema order, each once            extras: names never declared

Declared names appear at most once and extras can never spell a declared name, so a duplicate key cannot
override a checked value. Extras may repeat each other; json keeps the last, which validates too, but then
there are fewer properties than texts, so extras count toward `minProperties` at most once (one extra is one
property more than the declared ones written, for sure; two may be the same key).
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any

from hf_paged.processors.schema.context import Context, pointer_join
from hf_paged.processors.schema.fragments import Rx, alt, json_string, lit, opt, raw, rep, seq
from hf_paged.processors.schema.key_names import key_matches, key_readings, not_in
from hf_paged.processors.schema.name_rules import dependencies_of, forbidden_names, with_dependencies
from hf_paged.processors.schema.pattern import emit, parse_pattern
from hf_paged.processors.schema.values import valid_values

__all__ = ["key_matches", "member_order", "object_regex", "ordered_members"]

def ordered_members(
    elements: list[tuple[Rx | None, bool]],
    sep: Rx,
    min_count: int,
    max_count: int | None,
    tail: Callable[[int], Rx | None],
    ctx: Context | None = None,
    pointer: str = "#",
    extra: Rx | None = None,
) -> Rx | None:
    """Members in a fixed order, each (regex, required), joined by `sep`, with a member count bound.

    `tail(k)` gives the regex allowed after the members once k of them are written (e.g. extra keys, which must
    then make up any shortfall below `min_count`, and add their own separator when k > 0), None when nothing
    can complete the object. Required members whose regex is None make the whole thing None. With `ctx`, a
    fragment over its cost budget raises at once (`Context.check_cost`): counted members form a tree whose text
    doubles per member, so the check must come before the text is written, not after. `extra`: the one member
    that `tail(0)` starts with when it is `extra tail(1)` (optional when `min_count` is 0), as undeclared keys
    without an upper bound are (see `_linear_members`).
    """
    if any(m is None and req for m, req in elements):
        return None
    if max_count is None and min_count <= 1:
        return _linear_members(elements, sep, min_count, tail, extra)
    n = len(elements)
    saturate = max(1, min_count) if max_count is None else None  # counts above this all look alike
    memo: dict[tuple[int, int], Rx | None] = {}

    def f(i: int, k: int) -> Rx | None:
        if saturate is not None:
            k = min(k, saturate)
        key = (i, k)
        if key in memo:
            return memo[key]
        if i == n:
            out = tail(k)
        else:
            member, required = elements[i]
            lead = member if k == 0 else seq(sep, member)
            if saturate is not None and k == saturate and k >= min_count:
                # Saturated: later members only need a separator; keep the regex linear, not a tree.
                out = seq(lead, f(i + 1, k)) if required else seq(opt(lead), f(i + 1, k))
            else:
                take = None if max_count is not None and k + 1 > max_count else seq(lead, f(i + 1, k + 1))
                out = take if required else alt([take, f(i + 1, k)])
        if ctx is not None:
            ctx.check_cost(out, pointer)
        memo[key] = out
        return out

    return f(0, 0)


def _linear_members(elements: list[tuple[Rx | None, bool]], sep: Rx, min_count: int,
                    tail: Callable[[int], Rx | None], extra: Rx | None) -> Rx | None:
    """`ordered_members` without an upper bound and with at most one member required by count: linear size.

    Only the members before the first required one are hard: the first of them written has no separator.
    After the first member everything is `(sep m)?`. See `_any_first` for the optional ones before it. With
    nothing required and an `extra`, the first member written is a declared one or an extra, then the tail:
    `(P | E) tail(1)`, which writes the tail once, where `P tail(1) | E tail(1)` wrote it twice.
    """
    first_required = next((i for i, (_, req) in enumerate(elements) if req), len(elements))
    prefix = _any_first([m for m, _ in elements[:first_required] if m is not None], sep)
    rest: list[Rx | None] = []
    for member, required in elements[first_required + 1:]:
        if member is not None:
            rest.append(seq(sep, member) if required else opt(seq(sep, member)))
    if first_required == len(elements):  # nothing required: the members may be absent altogether
        if extra is not None:
            body = seq(alt([prefix, extra]), tail(1))
            return body if min_count else opt(body)
        written = None if prefix is None else seq(prefix, tail(1))
        return alt([written, tail(0)])  # no member written: the tail alone meets min_count
    head = elements[first_required][0]
    lead = head if prefix is None else seq(opt(seq(prefix, sep)), head)
    return seq(lead, *rest, tail(1))


def _any_first(members: list[Rx], sep: Rx) -> Rx | None:
    """Non-empty in-order subsequences of optional `members`, separated by `sep`, in linear size.

    Those ending at or before member j obey U_j = U_{j-1} (sep m_j)? | m_j: each member is written twice
    instead of once per possible first member (the quadratic form, exponential through nested objects). The
    recursion nests one group per member, and outlines-core's regex parser refuses nesting past ~250 groups
    (about 80 members), so long lists apply it to blocks of ~sqrt(n) members: V_k = V_{k-1} P_k | A_k, where
    A_k is U over block k and P_k its members each as `(sep m)?`. Nesting is then ~2 sqrt(n), size 3n.
    """
    if len(members) <= _FLAT_MEMBERS:
        return _subsequences(members, sep)
    size = math.isqrt(len(members) - 1) + 1
    out: Rx | None = None
    for start in range(0, len(members), size):
        block = members[start:start + size]
        first_here = _subsequences(block, sep)
        out = first_here if out is None else alt([seq(out, *(opt(seq(sep, m)) for m in block)), first_here])
    return out


_FLAT_MEMBERS = 24  # up to this many, one group per member (nesting well inside the parser's limit)


def _subsequences(members: list[Rx], sep: Rx) -> Rx | None:
    out: Rx | None = None
    for member in members:
        out = member if out is None else alt([seq(out, opt(seq(sep, member))), member])
    return out


def member_order(props: dict, required: list[str]) -> list[str]:
    """The order declared names are written in: the schema's, then required names it does not declare.

    (Keeping the schema's order costs nothing since `_linear_members`; models also expect it.)
    """
    return list(props) + [r for r in dict.fromkeys(required) if r not in props]


def object_regex(schema: dict, ctx: Context, pointer: str) -> Rx | None:
    """Regex of the JSON objects allowed by the object keywords of `schema`."""
    deps = dependencies_of(schema)
    if deps:
        return with_dependencies(schema, deps, ctx, pointer)
    props = schema.get("properties", {})
    required = schema.get("required", [])
    if not isinstance(props, dict):
        raise ctx.invalid(pointer_join(pointer, "properties"), "`properties` must be an object", "fix it")
    if not isinstance(required, list) or not all(isinstance(r, str) for r in required):
        raise ctx.invalid(pointer_join(pointer, "required"), "`required` must be a list of strings", "fix it")
    patterns = schema.get("patternProperties", {})
    extra_schema = schema.get("additionalProperties", True)
    if schema.get("unevaluatedProperties") is not None and schema.get("unevaluatedProperties") is not True:
        if schema["unevaluatedProperties"] is not False:
            ctx.unsupported("unevaluatedProperties", pointer, "only `false` is supported; use additionalProperties")
        extra_schema = False
    forbidden = forbidden_names(schema, required, ctx, pointer)
    allowed = _listed_names(schema.get("propertyNames"))
    # (`propertyNames` of listed names: every key is one of them, each then written as a declared member)
    names = member_order(props, required) + [n for n in allowed or [] if n not in props and n not in required]
    ws = raw(ctx.whitespace) if ctx.whitespace else Rx("", 0)
    colon = seq(ws, raw("\\:", atomic=True), ws)
    # Forbidden names may be undeclared: the extras must not spell them either.
    extra_names = names + sorted(forbidden - set(names))
    if ctx.stop_at_cut and _cuts_extras(schema, extra_schema, extra_names, ctx):
        ctx.cut()  # (raises: the ladder only needs to know that this try cuts, not its members' text)
    elements: list[tuple[Rx | None, bool]] = []
    for name in names:
        where = pointer_join(pointer, "properties", name)
        parts = [props[name]] if name in props else []
        readings = {pat: key_readings(pat, name, pointer_join(pointer, "patternProperties", pat)) for pat in patterns}
        parts += [patterns[pat] for pat, match in readings.items() if match.either]  # (JSON Schema: all of them)
        ecma_hit, python_hit = (any(m.ecma for m in readings.values()), any(m.python for m in readings.values()))
        if name not in props and not (ecma_hit and python_hit):
            parts.append(extra_schema)  # (no pattern applies under one reading or both: `KeyMatch`)
        value = None if name in forbidden else _value(parts, ctx, where)
        if value is not None and "propertyNames" in schema and not _name_ok(name, schema["propertyNames"], ctx, pointer):
            value = None
        member = seq(lit(json_string(name)), colon, value) if value is not None else None
        elements.append((member, name in required))
    state = {"extras": _extras(schema, extra_schema, extra_names, ctx, pointer, colon)}
    min_p, max_p = schema.get("minProperties", 0), schema.get("maxProperties")
    sep = seq(ws, raw("\\,", atomic=True), ws)
    assert sep is not None

    def tail(k: int) -> Rx | None:
        """Undeclared keys after k members, up to `maxProperties`; at least one when `minProperties` needs one more
        (see the module docstring: extras count toward it at most once)."""
        extras = state["extras"]
        need = max(0, int(min_p) - k)
        if need > 1 or (extras is None and need):
            return None
        if extras is None:
            return Rx("", 0)
        room = None if max_p is None else int(max_p) - k
        if room is not None and room < need:
            return None
        if room == 0:
            return Rx("", 0)
        hi = None if room is None else ctx.cap(room, need)
        if k > 0:
            return rep(seq(sep, extras), need, hi)
        first = seq(extras, rep(seq(sep, extras), max(0, need - 1), None if hi is None else hi - 1))
        return first if need > 0 else opt(first)

    def build(members: list[tuple[Rx | None, bool]]) -> Rx | None:
        body = ordered_members(members, sep, int(min_p), None if max_p is None else int(max_p), tail, ctx, pointer,
                               extra=state["extras"])  # (tail(0) is `extras tail(1)` when there is no max_p)
        return seq(raw("\\{", atomic=True), ws, body, ws, raw("\\}", atomic=True))

    out = build(elements)
    declared = sum(m is not None for m, _ in elements)
    if out is None and state["extras"] is not None and int(min_p) - declared > 1:  # not "no document satisfies"
        ctx.unsupported("minProperties", pointer, f"undeclared keys count toward it once (a regex cannot tell a "
                        f"repeated key from a new one), so at most {declared + 1} "
                        f"{'property is' if declared == 0 else 'properties are'} assured here: "
                        "declare the properties it needs, or lower minProperties")
    unwritten = _unwritten_keys(schema, extra_schema, extra_names, allowed)
    if (out is None and unwritten and int(min_p) > declared and (max_p is None or int(min_p) <= int(max_p))
            and all(m is not None for m, req in elements if req)):  # (not "no document satisfies": "not written")
        ctx.unsupported("minProperties", pointer, f"{unwritten} are not written here, so at most {declared} "
                        f"{'property is' if declared == 1 else 'properties are'} assured: declare the properties it "
                        "needs in `properties`, or lower minProperties")
    if ctx.prune_cost is not None and out is not None and out.cost > ctx.prune_cost:
        if state["extras"] is not None:  # undeclared keys go first: they cost a whole generic value
            state["extras"] = None
            ctx.num_pruned += 1
            out = build(elements)
        if out is not None and out.cost > ctx.prune_cost:
            out = _prune(elements, build, ctx)
    return ctx.check_cost(out, pointer)


def _prune(elements: list[tuple[Rx | None, bool]], build: Callable, ctx: Context) -> Rx | None:
    """Leave out the costliest optional members until the object fits `ctx.prune_cost` (fewest dropped)."""
    optional = sorted((i for i, (m, req) in enumerate(elements) if m is not None and not req),
                      key=lambda i: -elements[i][0].cost)  # type: ignore[union-attr]
    best: tuple[int, Rx | None] | None = None
    lo, hi = 1, len(optional)
    while lo <= hi:  # binary search on how many to drop
        mid = (lo + hi) // 2
        dropped = set(optional[:mid])
        candidate = build([(None if i in dropped else m, req) for i, (m, req) in enumerate(elements)])
        if candidate is None or candidate.cost <= ctx.prune_cost:  # type: ignore[operator]
            best, hi = (mid, candidate), mid - 1
        else:
            lo = mid + 1
    if best is None:
        dropped = set(optional)
        best = (len(optional), build([(None if i in dropped else m, req) for i, (m, req) in enumerate(elements)]))
    ctx.num_pruned += best[0]
    return best[1]


def _value(parts: list[Any], ctx: Context, where: str) -> Rx | None:
    if any(p is False for p in parts):
        return None
    parts = [p for p in parts if p is not True and p != {}]
    if len(parts) <= 1:
        return ctx.value(parts[0] if parts else True, where)
    return ctx.value({"allOf": parts}, where)


def _name_ok(name: str, names_schema: Any, ctx: Context, pointer: str) -> bool:
    """Whether a declared name satisfies `propertyNames`: its JSON spelling matches the names' regex, or, where the
    spelling holds an escape the regex of a bounded or patterned string never writes (`\\"`, `\\\\`, `\\uXXXX`:
    `strings.py`), jsonschema says so of the decoded name (the regex cannot: `{"required": ["\\""],
    "propertyNames": {"maxLength": 3}}` was refused as unsatisfiable)."""
    rx = ctx.sub(names_schema, pointer_join(pointer, "propertyNames"))
    spelled = json_string(name)
    if rx is not None and re.fullmatch(rx.text, spelled) is not None:
        return True
    return _UNSPELLED_ESCAPE.search(spelled) is not None and bool(valid_values([name], names_schema, ctx))


_UNSPELLED_ESCAPE = re.compile(r'\\["\\u]')


def _listed_names(names_schema: Any) -> list[str] | None:
    """The names a `propertyNames` of `enum` / `const` lists (its other keywords still checked, `_name_ok`)."""
    if not isinstance(names_schema, dict):
        return None
    listed = [names_schema["const"]] if "const" in names_schema else names_schema.get("enum")
    return list(dict.fromkeys(n for n in listed if isinstance(n, str))) if isinstance(listed, list) else None


def _unwritten_keys(schema: dict, extra_schema: Any, names: list[str], allowed: list[str] | None) -> str | None:
    """Which undeclared keys the schema allows that `_extras` does not write (a try's cut, `left out`, aside), or None:
    a pattern key could spell a declared name, and so could a key `propertyNames` allows (but one of listed names)."""
    patterns = schema.get("patternProperties")
    if "propertyNames" in schema:
        if (allowed is None and schema["propertyNames"] is not False and (extra_schema is not False or bool(patterns))
                and (names or patterns)):
            return "undeclared keys that `propertyNames` allows (beside declared names or `patternProperties`)"
        return None
    return "keys of `patternProperties` beside declared names" if patterns and names else None


def _extras_kind(schema: dict, extra_schema: Any, names: list[str], ctx: Context) -> str:
    """How this try writes the object's undeclared keys (`_extras`): "none"; "patterns" (keys drawn from
    `patternProperties`); "left out" (a cut: the schema allows them beside the declared `names`, this try keeps the
    declared ones alone); "value" (any key but the names, with `additionalProperties`' value); "names" (keys that
    `propertyNames` allows, when there are no names they could spell, with `additionalProperties`' value)."""
    if "propertyNames" in schema:
        names_schema = schema["propertyNames"]
        if (names or schema.get("patternProperties") or extra_schema is False or names_schema is False
                or _listed_names(names_schema) is not None):
            return "none"  # (a key it allows could spell a declared name; listed names are all declared)
        return "names"
    if schema.get("patternProperties"):
        return "patterns"
    if extra_schema is False:
        return "none"
    if names and not ctx.extras_beside_declared and (extra_schema is True or extra_schema == {}):
        return "left out"
    if schema.get("properties") and "additionalProperties" not in schema and not ctx.undeclared_keys:
        return "none"  # not asked for: generate the declared members only (a subset of the valid documents)
    return "value"


def _cuts_extras(schema: dict, extra_schema: Any, names: list[str], ctx: Context) -> bool:
    """Whether `_extras` cuts (`Context.cut`) in this try: keys left out, or a free value, which a flat translation
    nests only `any_depth` deep."""
    kind = _extras_kind(schema, extra_schema, names, ctx)
    return kind == "left out" or (kind in ("value", "names") and ctx.rules is None
                                  and (extra_schema is True or extra_schema == {}))


def _extras(schema: dict, extra_schema: Any, names: list[str], ctx: Context, pointer: str, colon: Rx) -> Rx | None:
    """One `"key": value` for names not declared, or None when we generate none.

    Free keys are bare-character strings that spell no declared name (a complement trie of the names), after
    the declared members; beside declared names only while `ctx.extras_beside_declared`. With `patternProperties` and no
    declared names, keys are drawn from the patterns instead, and their value must satisfy every pattern's
    schema (a key may match several). With `propertyNames` and no declared names, keys are the strings it allows
    (listed names are declared members instead, `_listed_names`); beside declared names, none (such a key could
    spell one of them).
    """
    kind = _extras_kind(schema, extra_schema, names, ctx)
    if kind == "patterns":
        patterns = schema["patternProperties"]
        if names or not isinstance(patterns, dict):
            return None  # a pattern key could spell a declared name: keep to the declared ones
        keys = [emit(parse_pattern(p, pointer_join(pointer, "patternProperties", p)), ctx.max_repeat, open_too=False)
                for p in patterns]
        key_rx = alt(seq(raw('"', atomic=True), k, raw('"', atomic=True)) for k in keys)
        values = [v for v in patterns.values() if v is not True and v != {}]
        value = ctx.value({"allOf": values} if len(values) > 1 else values[0] if values else True,
                        pointer_join(pointer, "patternProperties"))
        return seq(key_rx, colon, value) if value is not None else None
    if kind == "left out":
        ctx.cut()
    if kind not in ("value", "names"):
        return None
    value = ctx.value(extra_schema, pointer_join(pointer, "additionalProperties"))
    if value is None:
        return None
    if kind == "names":
        key_rx = ctx.sub({"allOf": [schema["propertyNames"], {"type": "string"}]}, pointer_join(pointer, "propertyNames"))
        return None if key_rx is None else seq(key_rx, colon, value)
    # A rule in a grammar when long (the complement trie of many names, which each count of members repeats); a
    # short one stays in place: called, its key would run beside the declared keys' (two stacks at once, slower
    # masks)
    return ctx.as_rule(seq(not_in(names), colon, value), pointer_join(pointer, "additionalProperties"), scale=16)
