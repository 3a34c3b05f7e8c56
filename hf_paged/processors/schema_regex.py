"""JSON Schema -> regex, sound first: every text the regex matches is JSON that validates against the schema.

Entry point of the schema layer; the processors compile its output with outlines-core's `Index`.

    schema --$ref / allOf merge / anyOf distribution--> branches (plain dicts)
           --type by type (numbers, strings, objects, arrays)--> Rx fragments --alternation--> regex

What cannot be enforced exactly raises `UnsupportedSchemaError` naming the keyword and its JSON pointer
(`strict=False`: a warning and a looser regex). The output is valid for Python `re` and Rust `regex-automata`.

Example:
    >>> import re
    >>> rx = schema_to_regex({"type": "integer", "minimum": 1, "maximum": 12})
    >>> bool(re.fullmatch(rx, "12")), bool(re.fullmatch(rx, "13"))
    (True, False)
"""

from __future__ import annotations

import time
import warnings
from dataclasses import dataclass
from typing import Any

from hf_paged.errors import InvalidSchemaError, SchemaTooComplexError, UnsatisfiableSchemaError
from hf_paged.processors.grammar_text import join_grammar
from hf_paged.processors.schema_arrays import array_regex
from hf_paged.processors.schema_context import (
    ANNOTATION_KEYWORDS,
    DEFAULT_WHITESPACE,
    MIN_RULE_COST,
    Context,
    pointer_join,
)
from hf_paged.processors.schema_name_rules import negated_required
from hf_paged.processors.schema_numbers import NUMBER, integer_regex, number_regex
from hf_paged.processors.schema_objects import object_regex
from hf_paged.processors.schema_oneof import TYPES, inferred_types, narrow_exclusive, types_of
from hf_paged.processors.schema_refs import merge_all, resolve_ref
from hf_paged.processors.schema_rx import Rx, alt, lit, opt, raw, rep, seq
from hf_paged.processors.schema_strings import string_regex
from hf_paged.processors.schema_values import dump_value, finite_domain, valid_values

__all__ = ["Branch", "branches", "canonical_json", "dump_value", "schema_to_grammar", "schema_to_regex"]

_MAX_MERGE_ROUNDS = 16


@dataclass(slots=True)
class _Attempt:
    """One try of the translation; later tries trade valid documents for a smaller automaton."""

    prune_cost: int | None  # None: exact; else the budget above which optional parts are left out
    repeat: int  # max_repeat (counted items, members, pattern repeats)
    string_repeat: int  # max_string_repeat (string lengths)
    ref_depth: int  # max_ref_depth
    extras: bool  # undeclared keys beside declared ones in open objects
    max_cost: int  # cost budget of this try (see `Context.max_cost`)
    narrow: bool = True  # counted strings below U+0800 only (`Context.narrow_strings`): every shrunk try
    any_depth: int = 1  # nesting of unconstrained values (`Context.any_depth`)
    calls: bool = False  # big values written once as grammar rules and called (`Context.rules`)
    rule_cost: int = MIN_RULE_COST  # with calls: values from this cost on are rules (`Context.min_rule_cost`)


def schema_to_regex(
    schema: dict | bool,
    *,
    whitespace: str | None = None,
    strict: bool = True,
    max_cost: int = 100_000,
    max_ref_depth: int = 3,
    max_repeat: int = 32,
    max_string_repeat: int = 256,
    max_seconds: float = 10.0,
    undeclared_keys: bool = True,
) -> str:
    """Translate a JSON Schema into a regex whose every match is a JSON text valid under the schema.

    Args:
        schema: the schema (dict or boolean).
        whitespace: regex of the whitespace allowed between tokens; None: `[ ]?` (bounded).
        strict: raise `UnsupportedSchemaError` on keywords we cannot enforce; False: warn and drop them.
        max_cost: budget of the estimated automaton size; above it `SchemaTooComplexError`.
        max_ref_depth: times one `$ref` may be entered on one path (recursion is cut off beyond, soundly).
        max_repeat: counted repetitions above this are lowered to it (fewer texts, all still valid).
        max_string_repeat: the same for string lengths (`maxLength`, counted `pattern` repeats).
        max_seconds: wall-clock budget of the translation itself (all retries together).
        undeclared_keys: let objects that declare properties but say nothing of `additionalProperties` also
            carry undeclared keys, after the declared ones, as JSON Schema allows (default); False: only the
            declared keys (a subset of the valid documents, as in xgrammar's and OpenAI's strict modes).

    Raises:
        InvalidSchemaError, UnsupportedSchemaError, UnsatisfiableSchemaError, InvalidRegexError,
        SchemaTooComplexError (all from `hf_paged.errors`).
    """
    return _translate_ladder(schema, False, whitespace, strict, max_cost, max_ref_depth, max_repeat,
                             max_string_repeat, max_seconds, undeclared_keys)


def schema_to_grammar(
    schema: dict | bool,
    *,
    whitespace: str | None = None,
    strict: bool = True,
    max_cost: int = 100_000,
    max_ref_depth: int = 3,
    max_repeat: int = 32,
    max_string_repeat: int = 256,
    max_seconds: float = 10.0,
    undeclared_keys: bool = True,
) -> str:
    """`schema_to_regex`, but a schema whose flat regex is over `max_cost`, or would allow less than the schema
    (undeclared keys beside declared ones, free values nested past two levels, recursion past `max_ref_depth`), is
    written as a grammar (big values and `$ref` targets as rules that every use calls, `grammar_text.join_grammar`)
    before anything is capped or left out. What the processors compile (`index_cache.build_automaton` takes both
    forms). Same arguments and errors as `schema_to_regex`."""
    return _translate_ladder(schema, True, whitespace, strict, max_cost, max_ref_depth, max_repeat,
                             max_string_repeat, max_seconds, undeclared_keys)


def _translate_ladder(schema: dict | bool, calls: bool, whitespace: str | None, strict: bool, max_cost: int,
                      max_ref_depth: int, max_repeat: int, max_string_repeat: int, max_seconds: float,
                      undeclared_keys: bool) -> str:
    if not isinstance(schema, (dict, bool)):
        raise InvalidSchemaError(f"a JSON Schema is an object or a boolean, got {type(schema).__name__}; "
                                 "pass a dict (parse JSON text with json.loads first)")
    ws = DEFAULT_WHITESPACE if whitespace is None else whitespace
    deadline = time.monotonic() + max_seconds
    # Exact first, with undeclared keys allowed in open objects; then without them (each open object's free
    # key-value loop is the costliest part of most real schemas); then spell counted strings below U+0800 only
    # (a third of their automaton: each counted character has its own UTF-8 continuation states); then cap counted repetitions (a DFA unrolls
    # `x{0,64}` into 64 copies of x, and real documents rarely come near such bounds) and recursion (each level
    # copies every recursive reference of the level above); only then leave out optional members / alternatives,
    # capping repetitions and recursion harder.
    # The first tries get a sixteenth / an eighth of the budget: free values after every open object inflate the
    # byte DFA faster than the cost estimate grows (measured: 2.6k -> 49k regex characters, 12 ms -> 4.8 s CPU).
    # The very first lets unconstrained values (`{}`, `additionalProperties: true`) nest two levels deep.
    # With `calls`, a flat try that cuts something the schema allows is kept aside; exact grammars come next (big
    # values written once, as rules: a flat regex copies each value once per context it may follow, and nested
    # optional members multiply them), then that flat try, and only then the tries that cap or leave out.
    shrinking = [
        _Attempt(None, max(max_repeat >> i, 1), max(max_string_repeat >> i, 1), max(max_ref_depth - d, 1), False,
                 max_cost, calls=calls)
        for i, d in ((0, 0), (1, 0), (2, 1), (3, 1), (3, 2))
    ] + [
        _Attempt(max_cost >> (2 * i), max(max_repeat >> (i + 1), 1), max(max_string_repeat >> (i + 1), 1),
                 max(max_ref_depth - 1 - i, 1), False, max_cost, calls=calls)
        for i in range(1, 5)
    ]
    flat_extras = [_Attempt(None, max_repeat, max_string_repeat, max_ref_depth, True, max_cost // 16, False, 2),
                   _Attempt(None, max_repeat, max_string_repeat, max_ref_depth, True, max_cost // 8, False)]
    flat = _Attempt(None, max_repeat, max_string_repeat, max_ref_depth, False, max_cost, False)
    attempts = [*flat_extras, flat]
    if calls:  # an exact grammar beats a flat regex that cuts anything (extras, free values' depth, recursion)
        # (every value a rule when the first grammar has a rule too long to build: an object of many small members)
        attempts += [_Attempt(None, max_repeat, max_string_repeat, max_ref_depth, extras, max_cost, False, calls=True,
                              rule_cost=cost) for extras in (True, False) for cost in (MIN_RULE_COST, 0)]
    attempts += shrinking
    num_exact = sum(a.prune_cost is None and not a.narrow for a in attempts)
    start = time.monotonic()
    too_many_visits: tuple[SchemaTooComplexError, int] | None = None  # (error, recursion depth it happened at)
    cut: str | None = None  # with calls: the first flat regex that cut something, used if no grammar fits
    for n, attempt in enumerate(attempts):
        if cut is not None and (attempt.narrow or attempt.prune_cost is not None):
            return cut  # no grammar fits: a flat regex that cuts a little beats one that leaves members out
        if attempt.prune_cost is None and n >= num_exact and time.monotonic() - start > max_seconds / 10:
            continue  # slow translations go straight to the pruning tries, which fit the budget sooner
        if too_many_visits is not None and attempt.ref_depth >= too_many_visits[1]:
            continue  # caps and pruning translate every sub-schema all the same: only less recursion visits fewer
        ctx = Context(root=schema, strict=strict, max_cost=attempt.max_cost, max_ref_depth=attempt.ref_depth,
                      max_repeat=attempt.repeat, max_string_repeat=attempt.string_repeat,
                      extras_beside_declared=attempt.extras, narrow_strings=attempt.narrow, whitespace=ws, translate=translate,
                      prune_cost=attempt.prune_cost, deadline=deadline, undeclared_keys=undeclared_keys,
                      any_depth=attempt.any_depth, rules={} if attempt.calls else None,
                      min_rule_cost=attempt.rule_cost)
        try:
            rx = translate(schema, ctx, "#")
        except SchemaTooComplexError as exc:
            if n == len(attempts) - 1 or time.monotonic() > deadline:
                raise
            if ctx.num_visits > ctx.max_visits:
                too_many_visits = (exc, attempt.ref_depth)
            continue  # retry, leaving out optional members and alternatives to fit the budget
        texts = [] if rx is None else [rx.text, *ctx.grammar_rules()]
        if rx is not None and n < len(attempts) - 1 and not all(map(_engine_accepts, texts)):
            continue  # too long to build in seconds, or over outlines-core's NFA size limit: retry smaller
        if calls and rx is not None and ctx.num_cut and not attempt.calls and not attempt.narrow:
            cut = cut or rx.text
            continue
        if rx is None:
            raise UnsatisfiableSchemaError("no JSON document satisfies this schema (or every way to satisfy it "
                                           "needs recursion deeper than max_ref_depth); check its constraints")
        if ctx.num_pruned or attempt.narrow:
            capped = (f"over the regex budget ({max_cost:,}): counted repetitions capped at {attempt.repeat} items / "
                      f"{attempt.string_repeat} characters (below U+0800); " if attempt.narrow else "")
            warnings.warn(f"{capped}left out {ctx.num_pruned} optional properties / anyOf branches / items of unique "
                          "arrays beyond the first (a regex cannot compare items); output stays valid but cannot use "
                          "them (raise max_cost to keep what the budget left out)", UserWarning, stacklevel=3)
        return join_grammar(texts[0], texts[1:]) if ctx.rule_texts else rx.text
    if cut is not None:
        return cut
    assert too_many_visits is not None, "only skipped tries end the loop without a result"
    raise too_many_visits[0]


_PROBE_CHARS = 16_000  # regexes shorter than this stay far below outlines-core's NFA size limit (measured)
_MAX_CHARS = 100_000  # longer ones take seconds to build (MaskBench: 105k chars 1.2 s, 110k chars 8 s CPU)


def _engine_accepts(text: str) -> bool:
    """Whether outlines-core can build the byte automaton of a long regex quickly (memoised, so the compile that
    follows reuses it); short ones are not probed, to keep the build off the caller's thread."""
    if len(text) < _PROBE_CHARS:
        return True
    if len(text) > _MAX_CHARS:
        return False
    from hf_paged.processors.byte_dfa import build_byte_dfa
    from hf_paged.processors.index_cache import anchored

    try:
        build_byte_dfa(anchored(text))
    except ValueError as exc:
        if "NFA" in str(exc) or "limit" in str(exc):
            return False
        raise
    return True


@dataclass(slots=True)
class Branch:
    """One alternative of a schema after `$ref`, `allOf`, `anyOf` and `oneOf` are flattened."""

    schema: Any  # a dict without $ref/allOf/anyOf/oneOf at its top level, or a boolean
    refs: list[str]  # $ref targets entered to build it (they count toward the recursion limit)
    call: str | None = None  # with grammar rules: the `$ref` target whose rule stands for this branch


def translate(schema: Any, ctx: Context, pointer: str) -> Rx | None:
    """Regex fragment of one (sub-)schema; None when nothing satisfies it."""
    ctx.num_visits += 1
    if time.monotonic() > ctx.deadline:
        raise SchemaTooComplexError("translating the schema took longer than max_seconds; simplify the schema "
                                    "(fewer alternatives or recursive $refs) or raise max_seconds")
    if ctx.num_visits > ctx.max_visits:
        raise SchemaTooComplexError(
            f"translating the schema visited more than {ctx.max_visits:,} sub-schemas (deep or mutually "
            "recursive $refs); lower max_ref_depth or simplify the schema"
        )
    out = []
    for branch in branches(schema, ctx, pointer):
        ctx.ref_stack.extend(branch.refs)
        try:
            if branch.call is not None:
                out.append(ctx.ref_rule(branch.call, branch.schema, pointer))
            else:
                out.append(_plain(branch.schema, ctx, pointer))
        finally:
            del ctx.ref_stack[len(ctx.ref_stack) - len(branch.refs):]
    result = alt(out)
    if ctx.prune_cost is not None and result is not None and result.cost > ctx.prune_cost:
        kept = sorted((r for r in out if r is not None), key=lambda r: r.cost)
        while len(kept) > 1 and sum(r.cost for r in kept) > ctx.prune_cost:
            kept.pop()  # leave out the costliest alternative: a subset, still sound
            ctx.num_pruned += 1
        result = alt(kept)
    return ctx.check_cost(result, pointer)


def branches(schema: Any, ctx: Context, pointer: str, entered: list[str] | None = None,
             calls: str = "always") -> list[Branch]:
    """Flatten `$ref`, `allOf`, `anyOf`, `oneOf` into alternatives (anyOf distributes over siblings).

    With grammar rules (`ctx.rules`), a bare `$ref` is a branch that calls the target's rule: `calls="always"`;
    `"recursion"` (an `anyOf` option): only a target entered again on its own path (options written in place
    make one automaton, while calls to several rules that start alike run side by side, costlier to mask);
    `"never"` (a `oneOf` option: exclusivity is decided on the flattened branches).

    `entered` are the `$ref` targets already resolved on the way here; a target entered `max_ref_depth`
    times (counting the translation's stack too) yields the empty branch: recursion is cut off soundly.
    """
    if isinstance(schema, bool):
        return [Branch(schema, [])]
    if not isinstance(schema, dict):
        raise ctx.invalid(pointer, f"a schema must be an object or a boolean, got {schema!r}", "fix the sub-schema")
    refs: list[str] = list(entered or [])
    current: Any = _double_negation(schema)
    for _ in range(_MAX_MERGE_ROUNDS):
        if not isinstance(current, dict) or not ("$ref" in current or "allOf" in current):
            break
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
                ctx.num_cut += 1
                return [Branch(False, refs)]
            refs.append(target.pointer)
            parts.insert(0, target.schema)
        current = _double_negation(merge_all([rest] + [_double_negation(p) for p in parts], ctx, pointer))
    else:
        ctx.num_cut += 1
        return [Branch(False, refs)]  # `$ref` chains deeper than the merge budget: cut off (sound)
    for key in ("anyOf", "oneOf"):
        if isinstance(current, dict) and key in current:
            options = current[key]
            if not isinstance(options, list) or not options:
                raise ctx.invalid(pointer_join(pointer, key), f"`{key}` must be a non-empty list", "fix it")
            rest = {k: v for k, v in current.items() if k != key}
            subs = []
            for i, option in enumerate(options):
                merged = {"allOf": [rest, option]} if rest else option
                option_calls = "recursion" if key == "anyOf" and calls != "never" else "never"
                subs.append(branches(merged, ctx, pointer_join(pointer, key, i), refs, option_calls))
            if key == "oneOf" and len(options) > 1:
                narrowed = narrow_exclusive([[b.schema for b in bs] for bs in subs],
                                            lambda values, sub: _none_valid(values, sub, ctx))
                if narrowed is None:
                    ctx.unsupported("oneOf", pointer, "its branches may overlap (exactly-one cannot be checked); use "
                                    "`anyOf`, or make branches disjoint by `type`, `required` keys or a `const` "
                                    "discriminator property")
                else:
                    kept = [[b for b in bs if b.schema is not False] for bs in subs]
                    subs = [[Branch(n, b.refs) for n, b in zip(ns, bs)] for ns, bs in zip(narrowed, kept)]
            return [b for bs in subs for b in bs]
    return [Branch(current, refs)]


def _double_negation(schema: Any) -> Any:
    """`not: {not: X}` is X: fold it into an `allOf` part so the usual merging applies."""
    if not isinstance(schema, dict) or "unevaluatedProperties" in schema or "unevaluatedItems" in schema:
        return schema  # `not` drops annotations: folding it would let unevaluated* see its properties
    neg = schema.get("not")
    if isinstance(neg, dict) and set(neg) - ANNOTATION_KEYWORDS == {"not"}:
        rest = {k: v for k, v in schema.items() if k != "not"}
        return {**rest, "allOf": list(rest.get("allOf", [])) + [neg["not"]]}
    return schema


def _plain(schema: Any, ctx: Context, pointer: str) -> Rx | None:
    """Regex of a schema without $ref/allOf/anyOf/oneOf at its top."""
    if schema is True or schema == {}:
        if ctx.rules is not None:  # one rule that calls itself: any depth
            return ctx.recursive_call("#any", lambda: _any_value_rule(ctx), pointer)
        ctx.num_cut += 1  # (nested at most `any_depth` deep)
        return any_value(ctx, ctx.any_depth)
    if schema is False:
        return None
    finite = finite_domain(schema)
    if finite is not None:
        # the candidates are the enum itself: checking them against it again would cost O(n^2) comparisons
        rest = {k: v for k, v in schema.items() if k != "enum"} if "enum" in schema else schema
        return alt(lit(t) for t in (dump_value(v) for v in valid_values(finite, rest, ctx)) if t is not None)
    types = _allowed_types(schema, ctx, pointer)
    if "if" in schema and ("then" in schema or "else" in schema):
        ctx.unsupported("if", pointer, "conditional schemas need negation; rewrite as `anyOf` of exclusive cases")
    for key in ("$dynamicRef", "$recursiveRef"):
        if key in schema:
            ctx.unsupported(key, pointer, "use a plain `$ref` to a `$defs` entry")
    parts: list[Rx | None] = []
    for t in types:
        if t == "null":
            parts.append(lit("null"))
        elif t == "boolean":
            parts.append(raw("true|false"))
        elif t == "integer" and "number" not in types:
            parts.append(integer_regex(schema, ctx, pointer))
        elif t == "number":
            parts.append(number_regex(schema, ctx, pointer))
        elif t == "string":
            parts.append(string_regex(schema, ctx, pointer))
        elif t == "array":
            parts.append(array_regex(schema, ctx, pointer, dump_value))
        elif t == "object":
            parts.append(object_regex(schema, ctx, pointer))
    return alt(parts)


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
    if isinstance(neg, dict) and neg and set(neg) - ANNOTATION_KEYWORDS == {"type"}:
        types -= types_of({"type": neg["type"]}) if neg["type"] != "number" else {"number", "integer"}
    elif neg is not None and neg is not False and negated_required(neg) is None:
        if "enum" not in schema and "const" not in schema:  # beside an enum, `not` filters the values
            ctx.unsupported("not", pointer, "only `not` of a `type`, of `required`, or of values beside an `enum` "
                            "is supported; remove `not`")
    if "integer" in types and "number" in types:
        types.discard("integer")
    return [x for x in TYPES if x in types]


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
_SCALARS = alt([raw("null|true|false"), NUMBER, _ANY_STRING])


def any_value(ctx: Context, depth: int) -> Rx | None:
    """Any JSON value, arrays and objects nested at most `depth` deep (keys may repeat: anything is valid)."""
    if depth <= 0:
        return _SCALARS
    return _any_value_of(ctx, any_value(ctx, depth - 1))


def _any_value_rule(ctx: Context) -> Rx | None:
    """The free value's grammar rule: arrays and objects of calls to itself (nested as deep as the call stack)."""
    inner = ctx.recursive_call("#any", lambda: None, "#")  # (being built: a call to the rule itself)
    return _any_value_of(ctx, inner)


def _any_value_of(ctx: Context, inner: Rx | None) -> Rx | None:
    """Any scalar, or an array / object whose items and values are `inner`."""
    ws = raw(ctx.whitespace) if ctx.whitespace else Rx("", 0)
    sep = seq(ws, raw("\\,", atomic=True), ws)
    member = seq(_ANY_STRING, ws, raw("\\:", atomic=True), ws, inner)
    array = seq(raw("\\[", atomic=True), ws, opt(seq(inner, rep(seq(sep, inner), 0, None))), ws, raw("\\]", atomic=True))
    obj = seq(raw("\\{", atomic=True), ws, opt(seq(member, rep(seq(sep, member), 0, None))), ws, raw("\\}", atomic=True))
    return alt([_SCALARS, array, obj])


def canonical_json(schema: dict | bool, instance: Any) -> str | None:
    """Write `instance` the way `schema_to_regex(schema)` spells it (for benchmarks and tests)."""
    from hf_paged.processors.schema_canonical import serialize

    return serialize(schema, instance)
