"""JSON Schema -> regex, sound first: every text the regex matches is JSON that validates against the schema.

The translation itself; `ladder` tries it with smaller caps until the automata fit the work budget, and the
processors compile the result (`index.index_cache`).

    schema --$ref / allOf merge / anyOf distribution--> branches (plain dicts)
           --type by type (numbers, strings, objects, arrays)--> Rx fragments --alternation--> regex

What cannot be enforced exactly raises `UnsupportedSchemaError` naming the keyword and its JSON pointer
(`strict=False`: a warning and a looser regex). The output is valid for Python `re` and Rust `regex-automata`.

Example:
    >>> import re
    >>> from hf_paged.processors.schema import schema_to_regex
    >>> rx = schema_to_regex({"type": "integer", "minimum": 1, "maximum": 12})
    >>> bool(re.fullmatch(rx, "12")), bool(re.fullmatch(rx, "13"))
    (True, False)
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Any

from hf_paged.errors import InvalidSchemaError, UnsupportedSchemaError
from hf_paged.processors.schema.arrays import array_regex
from hf_paged.processors.schema.conditionals import exactly_one, expand_conditionals, has_conditionals
from hf_paged.processors.schema.contains import PENDING, resolve_contains
from hf_paged.processors.schema.context import ANNOTATION_KEYWORDS, Context, pointer_join
from hf_paged.processors.schema.excluded import excluded_values, leave_out
from hf_paged.processors.schema.fragments import Rx, alt, lit, opt, raw, rep, seq
from hf_paged.processors.schema.name_rules import negated_required
from hf_paged.processors.schema.non_integers import non_integer_regex
from hf_paged.processors.schema.numbers import NumberDigits, integer_regex, number_regex, number_text
from hf_paged.processors.schema.objects import object_regex
from hf_paged.processors.schema.oneof import TYPES, inferred_types, narrow_exclusive, types_of
from hf_paged.processors.schema.refs import merge_all, resolve_ref
from hf_paged.processors.schema.reuse import mark, remember, reuse_key, reused
from hf_paged.processors.schema.strings import FORMATS, string_regex
from hf_paged.processors.schema.values import dump_value, finite_domain, finite_regex, valid_values

__all__ = ["Branch", "branches", "dump_value", "translate"]

_FREE_MERGE_ROUNDS = 16  # merge rounds one visit covers (the depth real schemas nest `allOf` / `$ref` to); each
# round beyond counts one more visit (`Context.visit`), so a deep chain is merged in full within the work budget


@dataclass(slots=True)
class Branch:
    """One alternative of a schema after `$ref`, `allOf`, `anyOf` and `oneOf` are flattened."""

    schema: Any  # a dict without $ref/allOf/anyOf/oneOf at its top level, or a boolean
    refs: list[str]  # $ref targets entered to build it (they count toward the recursion limit)
    call: str | None = None  # with grammar rules: the `$ref` target whose rule stands for this branch
    # cut off by `max_ref_depth` (`schema` is False: it matches nothing here), the schema it stands for, merged one
    # level: what a `oneOf` sibling must still exclude (read as matching nothing, it would let the overlap through)
    cut: Any = None


def translate(schema: Any, ctx: Context, pointer: str) -> Rx | None:
    """Regex fragment of one (sub-)schema; None when nothing satisfies it."""
    key = reuse_key(schema, ctx)
    if key is not None:
        hit = reused(key, ctx)
        if hit is not None:
            return hit[0]
        before = mark(ctx)
    ctx.visit()
    out = []
    for branch in branches(schema, ctx, pointer):
        ctx.ref_stack.extend(branch.refs)
        try:
            if branch.call is not None:
                out.append(ctx.ref_rule(branch.call, branch.schema, pointer))
                continue
            # a node of the document as an alternative (a `$ref` target written in place): reused like a node's
            # translation (`reuse.py`), under a key of its own (no visit or `check_cost` of its own to count again)
            part_key = None if branch.schema is schema else reuse_key(branch.schema, ctx, part=True)
            hit = None if part_key is None else reused(part_key, ctx)
            if hit is not None:
                out.append(hit[0])
                continue
            started = None if part_key is None else mark(ctx)
            rx = _plain(branch.schema, ctx, pointer)
            if started is not None and (rx is None or rx.cost <= ctx.max_cost):
                remember(part_key, rx, started, ctx)
            out.append(rx)
        finally:
            del ctx.ref_stack[len(ctx.ref_stack) - len(branch.refs):]
    result = alt(out)
    if ctx.prune_cost is not None and result is not None and result.cost > ctx.prune_cost:
        kept = sorted((r for r in out if r is not None), key=lambda r: r.cost)
        while len(kept) > 1 and sum(r.cost for r in kept) > ctx.prune_cost:
            kept.pop()  # leave out the costliest alternative: a subset, still sound
            ctx.num_pruned += 1
        result = alt(kept)
    result = ctx.check_cost(result, pointer)
    if key is not None:
        remember(key, result, before, ctx)
    return result


def branches(schema: Any, ctx: Context, pointer: str, entered: list[str] | None = None,
             calls: str = "always") -> list[Branch]:
    """Flatten `$ref`, `allOf`, `anyOf`, `oneOf` into alternatives (anyOf distributes over siblings).

    With grammar rules (`ctx.rules`), a bare `$ref` is a branch that calls the target's rule: `calls="always"`;
    `"recursion"` (an `anyOf` option): only a target entered again on its own path (options written in place
    make one automaton, while calls to several rules that start alike run side by side, costlier to mask);
    `"never"` (a `oneOf` option: exclusivity is decided on the flattened branches).

    `entered` are the `$ref` targets already resolved on the way here; a target entered `max_ref_depth`
    times (counting the translation's stack too) yields the empty branch: recursion is cut off soundly (`Branch.cut`
    keeps what it stands for, which a `oneOf` sibling must still exclude).
    """
    if isinstance(schema, bool):
        return [Branch(schema, [])]
    if not isinstance(schema, dict):
        raise ctx.invalid(pointer, f"a schema must be an object or a boolean, got {schema!r}", "fix the sub-schema")
    refs: list[str] = list(entered or [])
    current: Any = expand_conditionals(_double_negation(schema))
    num_rounds = 0
    # Merged to any depth (a branch cut short here would read as matching nothing, and a `oneOf` sibling would then
    # be taken as exclusive of it: a false accept); each `$ref` entered counts toward `max_ref_depth` and each `allOf`
    # level is a node of the document, so the rounds end, and those past `_FREE_MERGE_ROUNDS` count as visits
    while isinstance(current, dict) and ("$ref" in current or "allOf" in current):
        num_rounds += 1
        if num_rounds > _FREE_MERGE_ROUNDS:
            ctx.visit()
        parts = current.get("allOf", [])
        if not isinstance(parts, list):
            raise ctx.invalid(pointer_join(pointer, "allOf"), "`allOf` must be a list", "fix it")
        parts = list(parts)
        rest = {k: v for k, v in current.items() if k not in ("allOf", "$ref")}
        if "$ref" in current:
            target = resolve_ref(current["$ref"], ctx, pointer)
            entered = (ctx.ref_stack + refs).count(target.pointer)
            if (ctx.rules is not None and not parts and set(rest) <= ANNOTATION_KEYWORDS
                    and (calls == "always" or calls == "recursion" and entered)):
                return [Branch(target.schema, refs, call=target.pointer)]  # the target's rule (`Context.ref_rule`)
            if entered >= ctx.max_ref_depth:
                ctx.cut()
                return [Branch(False, refs, cut=_cut_view([rest, target.schema] + parts, ctx, pointer))]
            refs.append(target.pointer)
            parts.insert(0, target.schema)
        if has_conditionals(rest, parts):  # (each part's `if`, before merging them)
            expanded = expand_conditionals({**rest, "allOf": parts})
            rest, parts = {k: v for k, v in expanded.items() if k != "allOf"}, expanded["allOf"]
        current = _double_negation(merge_all([rest] + [_double_negation(p) for p in parts], ctx, pointer))
    if isinstance(current, dict) and PENDING in current:  # (several `contains`: placed once the branch is whole)
        current = resolve_contains(current, ctx, pointer)
    # The schema's own unevaluatedProperties / unevaluatedItems (none merged in from an `allOf` part, which cannot see
    # its siblings) see what the passing option evaluates: the option goes in as the schema's in-place child
    sees_options = current is schema and ("unevaluatedProperties" in schema or "unevaluatedItems" in schema)
    for key in ("anyOf", "oneOf"):
        if isinstance(current, dict) and key in current:
            options = current[key]
            if not isinstance(options, list) or not options:
                raise ctx.invalid(pointer_join(pointer, key), f"`{key}` must be a non-empty list", "fix it")
            rest = {k: v for k, v in current.items() if k != key}
            subs = []
            for i, option in enumerate(options):
                merged = {**rest, "allOf": [option]} if sees_options else {"allOf": [rest, option]} if rest else option
                option_calls = "recursion" if key == "anyOf" and calls != "never" else "never"
                subs.append(branches(merged, ctx, pointer_join(pointer, key, i), refs, option_calls))
            if key == "oneOf" and len(options) > 1:
                num_branches = sum(map(len, subs))
                ctx.budget.spend("checks", num_branches * num_branches)  # (every branch against every other's)
                ctx.branch_checks += num_branches * num_branches
                narrowed = narrow_exclusive([[b.schema for b in bs] for bs in subs],
                                            lambda values, sub: _none_valid(values, sub, ctx),
                                            [[b.schema if b.cut is None else b.cut for b in bs] for bs in subs])
                alone = None if narrowed is not None or sees_options else exactly_one(
                    options, lambda option: _resolved(option, ctx, pointer))
                if alone is not None:  # each option where no other holds (`conditionals.exactly_one`)
                    return [b for i, option in enumerate(alone) for b in branches(
                        {"allOf": [rest, option]} if rest else option, ctx, pointer_join(pointer, key, i), refs,
                        "never")]
                if narrowed is None:
                    ctx.unsupported("oneOf", pointer, "its branches may overlap (exactly-one cannot be checked); use "
                                    "`anyOf`, or make branches disjoint by `type`, `required` keys or a `const` "
                                    "discriminator property")
                else:
                    kept = [[b for b in bs if b.schema is not False] for bs in subs]
                    subs = [[Branch(n, b.refs) for n, b in zip(ns, bs)] for ns, bs in zip(narrowed, kept)]
            return [b for bs in subs for b in bs]
    return [Branch(current, refs)]


def _cut_view(parts: list[Any], ctx: Context, pointer: str) -> Any:
    """What a branch cut off by the recursion limit stands for, merged one level (`Branch.cut`); True (anything: no
    sibling can be shown exclusive of it) where the parts do not merge."""
    try:
        return merge_all(parts, ctx, pointer)
    except (InvalidSchemaError, UnsupportedSchemaError):
        return True


def _resolved(option: Any, ctx: Context, pointer: str) -> Any:
    """The schema a bare `$ref` option names (one step), else the option."""
    if isinstance(option, dict) and set(option) - ANNOTATION_KEYWORDS == {"$ref"}:
        return resolve_ref(option["$ref"], ctx, pointer).schema
    return option


def _double_negation(schema: Any) -> Any:
    """`not: {not: X}` is X: fold it into an `allOf` part so the usual merging applies. `not: false` holds for
    every value and is dropped; `not: true` (or `{}`) for none."""
    if not isinstance(schema, dict):
        return schema
    neg = schema.get("not")
    if neg is False:
        return {k: v for k, v in schema.items() if k != "not"}
    if neg is True or neg == {}:
        return False
    if "unevaluatedProperties" in schema or "unevaluatedItems" in schema:
        return schema  # `not` drops annotations: folding it would let unevaluated* see its properties
    if isinstance(neg, dict) and set(neg) - ANNOTATION_KEYWORDS == {"not"}:
        rest = {k: v for k, v in schema.items() if k != "not"}
        return {**rest, "allOf": list(rest.get("allOf", [])) + [neg["not"]]}
    return schema


def _formatted(values: list[Any], fmt: str, ctx: Context, pointer: str) -> list[Any]:
    """The `values` a `format` we enforce allows: its strings that the format's regex spells (jsonschema checks an
    enum's values without a format checker, so `{"format": "date", "enum": ["nope"]}` let "nope" through, where every
    other string beside that format is held to it); other types as they are."""
    body = string_regex({"type": "string", "format": fmt}, ctx, pointer)
    spelled = re.compile(body.text) if body is not None else None
    return [v for v in values if not isinstance(v, str) or (spelled is not None and spelled.fullmatch(dump_value(v)))]


def _plain(schema: Any, ctx: Context, pointer: str) -> Rx | None:
    """Regex of a schema without $ref/allOf/anyOf/oneOf at its top."""
    if schema is True or schema == {}:
        if ctx.rules is not None:  # one rule that calls itself: any depth
            return ctx.recursive_call("#any", lambda: _any_value_rule(ctx), pointer)
        ctx.cut()  # (nested at most `any_depth` deep)
        return any_value(ctx, ctx.any_depth)
    if schema is False:
        return None
    finite = finite_domain(schema)
    if finite is not None:
        # the candidates are the enum itself (or the const): checking them against it again would cost O(n^2)
        # comparisons (and, for a const, jsonschema's import: `values._type_check` takes a plain `type` only)
        drop = "enum" if "enum" in schema else "const" if "const" in schema else None
        rest = {k: v for k, v in schema.items() if k != drop} if drop else schema
        if isinstance(rest.get("format"), str) and rest["format"] in FORMATS:
            finite = _formatted(finite, rest["format"], ctx, pointer)
        return finite_regex(finite, rest, ctx)
    types = _allowed_types(schema, ctx, pointer)
    if "if" in schema and ("then" in schema or "else" in schema):
        why = ("beside `unevaluatedProperties`/`unevaluatedItems` (which see only what a passing `if` evaluates)"
               if "unevaluatedProperties" in schema or "unevaluatedItems" in schema else "its condition has keywords we "
               "cannot negate (`pattern`, `$ref`, ...), or the conditionals combine into more than 64 cases")
        ctx.unsupported("if", pointer, f"{why}; rewrite them as `anyOf` of exclusive cases")
    for key in ("$dynamicRef", "$recursiveRef"):
        if key in schema:
            ctx.unsupported(key, pointer, "use a plain `$ref` to a `$defs` entry")
    excluded = excluded_values(schema["not"]) if "not" in schema else None  # (`not` of values: `excluded.py`)
    parts: list[Rx | None] = []
    for t in types:
        if t == "integer" and "number" in types:
            continue
        build = _BY_TYPE[t]  # (called from here: a helper frame in between, one more per nesting level, made a deep
        # schema's compile 2x slower on CPython 3.11, its frame stack mapping and unmapping a chunk ~4x as often)
        if excluded is None:
            parts.append(build(schema, ctx, pointer))
        else:
            parts.append(leave_out(t, schema, excluded, lambda s, build=build: build(s, ctx, pointer), ctx, pointer))
    result = alt(parts)
    if result is None and types and "type" not in schema and inferred_types(schema):
        ctx.nothing(pointer, f"no {' or '.join(types)} satisfies it, and without `type` its keywords are read as asking "
                    "for that (JSON Schema would let any other type through: say which with `type`)")
    return result


def _allowed_types(schema: dict, ctx: Context, pointer: str) -> list[str]:
    t = schema.get("type")
    if t is None:
        types = inferred_types(schema) or set(TYPES)
    else:
        listed = [t] if isinstance(t, str) else t
        if not isinstance(listed, list) or not all(x in TYPES for x in listed):
            raise ctx.invalid(pointer_join(pointer, "type"), f"unknown type {t!r}", f"use one of {list(TYPES)}")
        types = set(listed)
    neg = schema.get("not")
    if neg is True or neg == {}:
        return []
    non_integer = False
    if isinstance(neg, dict) and neg and set(neg) - ANNOTATION_KEYWORDS == {"type"}:
        negated = types_of({"type": neg["type"]})
        listed = {neg["type"]} if isinstance(neg["type"], str) else set(neg["type"])
        # `not: {type: integer}` beside numbers: those with a fractional part (1.0 and 1e3 are integers too)
        non_integer = "number" in types and "integer" in listed and "number" not in listed
        types -= negated | ({"number"} if non_integer else set())
    elif neg is not None and neg is not False and negated_required(neg) is not None:
        types &= {"object"}  # every other value has the names `required` asks for (it binds objects only): `not` fails
    elif neg is not None and neg is not False:
        # beside an enum, `not` filters the values; `not` of values alone leaves them out (`excluded.py`)
        if "enum" not in schema and "const" not in schema and excluded_values(neg) is None:
            ctx.unsupported("not", pointer, "only `not` of a `type`, of `required`, or of values (`const`, `enum`) is "
                            "supported; remove `not`")
    if "integer" in types and "number" in types:
        types.discard("integer")
    return [x for x in TYPES if x in types] + ([_NON_INTEGER] if non_integer else [])


_NON_INTEGER = "non-integer"  # (a pseudo type of `_allowed_types`: numbers that are not integers)

_BY_TYPE = {  # `_allowed_types`' names -> the regex of a schema's values of that type
    "null": lambda schema, ctx, pointer: lit("null"),
    "boolean": lambda schema, ctx, pointer: raw("true|false"),
    "integer": integer_regex,
    "number": number_regex,
    _NON_INTEGER: non_integer_regex,
    "string": string_regex,
    "array": functools.partial(array_regex, canonical=dump_value),
    "object": object_regex,
}


def _none_valid(values: list[Any], schema: Any, ctx: Context) -> bool:
    """Whether the root's validator rejects every value under `schema` (False when it cannot evaluate it)."""
    try:
        return not valid_values(values, schema, ctx)
    except InvalidSchemaError:
        return False


# Strings inside an unconstrained value: bare characters and short escapes, no `\uXXXX` (which JSON writers
# use only for rare control characters). A subset, still valid; it keeps the free value, which every open
# object repeats for its undeclared keys, about a third of the automaton of the full string grammar.
_ANY_STRING = raw('"(?:[^"\\\\\\x00-\\x1f]|\\\\["\\\\/bfnrt])*"', atomic=True)


def _scalars(digits: NumberDigits | None) -> Rx | None:
    return alt([raw("null|true|false"), number_text(digits), _ANY_STRING])


def any_value(ctx: Context, depth: int) -> Rx | None:
    """Any JSON value, arrays and objects nested at most `depth` deep (keys may repeat: anything is valid)."""
    return _any_value_text(ctx.whitespace, depth, ctx.number_digits)


@functools.lru_cache(maxsize=64)
def _any_value_text(whitespace: str | None, depth: int, digits: NumberDigits | None = None) -> Rx | None:
    """`any_value`'s fragment, which depends only on the whitespace, the depth and the number digits: built once
    per process (every open object of every schema repeats it; each level's text is ~4x the one below)."""
    if depth <= 0:
        return _scalars(digits)
    return _any_value_parts(whitespace, _any_value_text(whitespace, depth - 1, digits), digits)


def _any_value_rule(ctx: Context) -> Rx | None:
    """The free value's grammar rule: arrays and objects of calls to itself (nested as deep as the call stack)."""
    inner = ctx.recursive_call("#any", lambda: None, "#")  # (being built: a call to the rule itself)
    return _any_value_parts(ctx.whitespace, inner, ctx.number_digits)


def _any_value_parts(whitespace: str | None, inner: Rx | None, digits: NumberDigits | None) -> Rx | None:
    """Any scalar, or an array / object whose items and values are `inner`."""
    ws = raw(whitespace) if whitespace else Rx("", 0)
    sep = seq(ws, raw("\\,", atomic=True), ws)
    member = seq(_ANY_STRING, ws, raw("\\:", atomic=True), ws, inner)
    array = seq(raw("\\[", atomic=True), ws, opt(seq(inner, rep(seq(sep, inner), 0, None))), ws, raw("\\]", atomic=True))
    obj = seq(raw("\\{", atomic=True), ws, opt(seq(member, rep(seq(sep, member), 0, None))), ws, raw("\\}", atomic=True))
    return alt([_scalars(digits), array, obj])
