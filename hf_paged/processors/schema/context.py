"""State shared by one schema-to-regex translation: options, budgets, the root for `$ref`, and error helpers.

One `Context` lives for one `schema_to_regex` call. It carries the knobs (whitespace, strictness, size and
recursion budgets) and the single place that decides between raising `UnsupportedSchemaError` (strict) and
warning (non-strict), so every module reports unsupported keywords the same way: keyword + JSON pointer + fix.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from hf_paged.errors import InvalidSchemaError, SchemaTooComplexError, UnsupportedSchemaError
from hf_paged.processors.automaton.grammar import MAX_RULES, call_regex
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.schema.digits import NumberDigits
from hf_paged.processors.schema.fragments import Rx, raw

__all__ = ["ANNOTATION_KEYWORDS", "DEFAULT_WHITESPACE", "Context", "CutShort", "pointer_join"]

DEFAULT_WHITESPACE = "[ ]?"  # at most one space between tokens: no runaway whitespace
MIN_RULE_COST = 400  # values cheaper than this (~100 automaton states) are written in place, not called
_CALL_COST = 20  # a call's own cost: the mark and three digit bytes
GRAMMAR_BUDGET = 4  # a grammar's rules together may cost this many times `max_cost` (each rule at most `max_cost`)
_NOTHING = "\\x02\\x02"  # a rule text no document matches (the mark byte leads nowhere inside a rule)

# Keywords that never restrict validation (annotations, identifiers, metadata): ignored on purpose.
ANNOTATION_KEYWORDS = frozenset(
    {
        "title", "description", "default", "examples", "example", "$comment", "$schema", "$id", "id",
        "$anchor", "$dynamicAnchor", "$vocabulary", "deprecated", "readOnly", "writeOnly",
        "contentMediaType", "contentEncoding", "contentSchema", "$defs", "definitions", "markdownDescription",
    }
)


def pointer_join(pointer: str, *tokens: Any) -> str:
    """JSON pointer `pointer` extended by `tokens` (escaped per RFC 6901)."""
    for t in tokens:
        t = str(t)
        if "~" in t or "/" in t:
            t = t.replace("~", "~0").replace("/", "~1")
        pointer += "/" + t
    return pointer


class CutShort(Exception):
    """A translation with `Context.stop_at_cut` reached its first cut (`Context.cut`): the ladder's verdict on the
    try is known, so the rest of it is not translated. Internal: the ladder catches it."""


@dataclass(slots=True)
class Context:
    """Options and budgets of one translation.

    Args:
        root: the whole schema, target of `#...` references.
        whitespace: regex of the whitespace allowed between JSON tokens.
        number_digits: the user's bounds on a number's digits (`NumberDigits`); None: the default, which bounds
            only fraction and exponent digits of numbers without bounds (no double value needs more).
        strict: raise on keywords we cannot enforce; False: warn and drop them (looser output).
        max_cost: budget of the estimated automaton size (see `Rx.cost`).
        max_ref_depth: how many times one `$ref` may be entered on one path (recursive schemas).
        max_repeat: counted repetitions (`maxLength`, `maxItems`, `{m,n}` in patterns) above this are
            lowered to it; a subset of the valid language, so still sound, but compilable.
        max_string_repeat: the same for string lengths (`maxLength`, counted `pattern` repeats): a counted
            character costs ~4 automaton states, far less than a counted item or member.
        extras_beside_declared: whether an open object (`additionalProperties` absent or true) may carry
            undeclared keys after its declared ones (a free key-value pair per extra).
        undeclared_keys: whether an object with declared properties and no `additionalProperties` keyword may
            get undeclared keys (on by default: JSON Schema allows them; off, as in xgrammar's and OpenAI's strict
            modes, only the declared keys). An explicit `additionalProperties` is always followed.
        narrow_strings: counted strings (`minLength`/`maxLength` without `pattern`) spell only characters below
            U+0800, which costs a third of the automaton states (a subset, so still sound); for shrunk tries.
        any_depth: nesting depth of the arrays/objects produced for an unconstrained value (`{}`, `true`).
        prune_cost: None: exact translation. Else the per-object / per-alternation budget above which
            optional properties and `anyOf` branches are left out (a subset of the valid documents, so still
            sound); `schema_to_regex` sets it when the exact regex exceeds `max_cost`.
        rules: None: one flat regex. Else member values and array items costing at least `min_rule_cost` become
            grammar rules (text -> number, written once, called from every use: `grammar_dfa`), and so do `$ref`
            targets and the free value; each rule's cost stays within `max_cost`, all together within
            `GRAMMAR_BUDGET` x `max_cost`.
        stop_at_cut: raise `CutShort` at the first cut (`cut`): a flat try that the ladder sets aside once it
            cuts anything, while exact grammars remain to be tried.
    """

    root: Any
    whitespace: str = DEFAULT_WHITESPACE
    number_digits: NumberDigits | None = None  # the user's digit bounds; None: `numbers.DEFAULT_DIGITS`
    strict: bool = True
    max_cost: int = 10_000
    max_ref_depth: int = 3
    max_repeat: int = 32
    max_string_repeat: int = 256
    extras_beside_declared: bool = True
    undeclared_keys: bool = True
    narrow_strings: bool = False
    any_depth: int = 1
    prune_cost: int | None = None  # when set: drop optional members / alternatives costlier than this budget
    budget: CompileBudget = field(default_factory=CompileBudget)  # work counted across the ladder's tries
    checked: dict[str, list[int]] = field(default_factory=dict)  # `valid_values` memo, shared by the ladder's tries
    finite: dict[str, tuple[Rx | None]] = field(default_factory=dict)  # `finite_regex` memo, shared by them too
    empty: list[str] = field(default_factory=list)  # the first parts found to allow no value (`nothing`): told
    #   when the whole schema allows none
    max_visits: int = 20_000  # sub-schema translations allowed in this try (recursive $refs multiply them)
    num_visits: int = 0
    branch_checks: int = 0  # the budget's checks of `oneOf` branches against each other so far (`reuse.py`)
    built_work: tuple[int, ...] = (0,) * 5  # the `work_counters` spent building rules so far (`reuse.py`)
    num_cut: int = 0  # places a flat translation allows less than the schema (free values' depth, extras, recursion)
    stop_at_cut: bool = False  # raise `CutShort` at the first cut instead of counting it
    num_pruned: int = 0  # optional properties and anyOf branches dropped to fit the budget (reported once)
    rules: dict[str, int] | None = None  # value rule text -> its number (1, 2, ...), when values may be called
    min_rule_cost: int = MIN_RULE_COST  # values cheaper than this are written in place (0: every value a rule)
    rule_texts: list[str | None] = field(default_factory=list)  # rule n's text at n - 1 (None: matches nothing)
    ref_rules: dict[str, int] = field(default_factory=dict)  # recursive rule (`$ref` target, free value) -> number
    defining: list[str] = field(default_factory=list)  # keys (`$ref` targets, the free value) of the recursive rules
    #   being built (calls to them are fine), outermost first
    _recursive: set[int] = field(default_factory=set)  # rules called while being built
    _built: dict[int, Rx | None] = field(default_factory=dict)  # recursive rules' translations
    _called: set[int] = field(default_factory=set)  # rules some text calls (the others compile as nothing)
    rules_cost: int = 0  # cost of the rules so far
    # the dispatcher (`translate.translate`), passed in by the callers (avoids a cycle)
    translate: Callable[..., Rx | None] | None = None
    ref_stack: list[str] = field(default_factory=list)  # $ref targets entered on the current path
    ref_index: dict = field(default_factory=dict)  # $id / $anchor -> RefTarget, built on the first $ref
    resolved: dict = field(default_factory=dict)  # local `#/...` $ref -> RefTarget (`refs.resolve_ref`'s memo)
    draft4: bool = False  # `$schema` says draft-04 (boolean exclusiveMinimum/Maximum)
    validator: Any = None  # jsonschema validator of the root, built on first use (value checks evolve it)
    reach: Any = None  # `reuse.Reach` of the root, shared by the ladder's tries; None: translations are not reused
    translations: dict | None = None  # this try's reusable translations (`reuse.py`), from the first node seen twice
    seen: set[int] = field(default_factory=set)  # nodes translated so far, until then

    def unsupported(self, keyword: str, pointer: str, fix: str, *, restricts: bool = True) -> None:
        """Report a keyword we cannot enforce: raise when strict, warn otherwise."""
        where = pointer_join(pointer, keyword)
        msg = f"schema keyword `{keyword}` at {where!r} cannot be enforced by a regular expression; {fix}"
        if self.strict:
            raise UnsupportedSchemaError(msg + " (or pass strict=False to drop it with a warning)")
        effect = "output may violate it" if restricts else "output is looser than the schema allows"
        warnings.warn(f"{msg}; dropped because strict=False: {effect}", UserWarning, stacklevel=4)

    def nothing(self, pointer: str, why: str) -> None:
        """A part that allows no value: remember why (the first three), for the error if the whole schema is
        empty (a branch of an anyOf may be empty while the schema is not)."""
        if len(self.empty) < 3:
            self.empty.append(f"{pointer or '#'}: {why}")

    def invalid(self, pointer: str, problem: str, fix: str) -> InvalidSchemaError:
        """An `InvalidSchemaError` naming where and what."""
        return InvalidSchemaError(f"invalid schema at {pointer or '#'!r}: {problem}; {fix}")

    def check_cost(self, rx: Rx | None, pointer: str) -> Rx | None:
        """Count the fragment's text as the translation's work (`CompileBudget.text`: writing it cost about that
        many steps), and raise `SchemaTooComplexError` when its cost exceeds `max_cost`; the error carries the
        `pointer` and `cost` (the ladder skips tries that cannot change them)."""
        if rx is None:
            return rx
        self.budget.spend("text", len(rx.text))
        if rx.cost > self.max_cost:
            error = SchemaTooComplexError(
                f"the regex for {pointer or '#'!r} would unroll to ~{rx.cost:,} automaton states, over the "
                f"budget of {self.max_cost:,} (~{self.max_cost // 4:,} automaton states) even with optional "
                "properties left out; simplify the schema (fewer alternatives, smaller maxItems/maxLength), "
                "or raise max_cost"
            )
            error.pointer, error.cost = pointer, rx.cost  # type: ignore[attr-defined]
            raise error
        return rx

    def work_counters(self) -> tuple[int, ...]:
        """What a translation's work and effects are counted in: cuts, members left out, visits (`visit` counts this
        try's and the budget's together), the budget's text, `branch_checks`."""
        return (self.num_cut, self.num_pruned, self.num_visits, self.budget.text, self.branch_checks)

    def visit(self, count: int = 1) -> None:
        """Count `count` sub-schema translations against `max_visits` and the budget's `visits` (a reused one counts
        all that translating it again would: `reuse.py`)."""
        self.num_visits += count
        self.budget.spend("visits", count)
        if self.num_visits > self.max_visits:
            raise SchemaTooComplexError(
                f"translating the schema visited more than {self.max_visits:,} sub-schemas (deep or mutually "
                "recursive $refs); lower max_ref_depth or simplify the schema"
            )

    def cut(self) -> None:
        """Count a place where this translation allows less than the schema (undeclared keys left out, a free
        value's nesting or a recursion cut off); with `stop_at_cut`, stop the translation here (`CutShort`)."""
        self.num_cut += 1
        if self.stop_at_cut:
            raise CutShort

    def cap(self, hi: int | None, lo: int = 0) -> int | None:
        """Lower a counted repetition's upper bound to the `max_repeat` budget (never below `lo`)."""
        if hi is None or hi <= self.max_repeat:
            return hi
        return max(self.max_repeat, lo)

    def cap_string(self, hi: int | None, lo: int = 0) -> int | None:
        """Lower a string length bound to the `max_string_repeat` budget (never below `lo`)."""
        if hi is None or hi <= self.max_string_repeat:
            return hi
        return max(self.max_string_repeat, lo)

    def sub(self, schema: Any, pointer: str) -> Rx | None:
        """Translate a sub-schema through the dispatcher."""
        assert self.translate is not None, "Context.translate is set by schema_to_regex"
        return self.translate(schema, self, pointer)

    def value(self, schema: Any, pointer: str) -> Rx | None:
        """A member value or an array item: `sub`, or, when `rules` is on and it is big, a call to it as a rule
        (the same text is one rule however many places use it). Only where the text is concatenated, never
        matched with `re` (a call is not the text it stands for)."""
        return self.as_rule(self.sub(schema, pointer), pointer)

    def as_rule(self, rx: Rx | None, pointer: str, scale: int = 1) -> Rx | None:
        """`rx` itself, or, when `rules` is on and it costs at least `scale` x `min_rule_cost`, a call to it as a
        rule (one rule per distinct text)."""
        if self.rules is None or rx is None or rx.cost < scale * self.min_rule_cost:
            return rx
        number = self.rules.get(rx.text)
        if number is None:
            number = self.rules[rx.text] = self._new_rule(pointer)
            self._define_rule(number, rx, pointer)
        return self._call(number)

    def recursive_call(self, key: str, build: Callable[[], Rx | None], pointer: str) -> Rx | None:
        """A call to the rule named `key` (a `$ref` target, or the free value), built on first use by `build`, in
        which calls to `key` itself already work: recursion as deep as the automaton's call stack
        (`grammar_dfa.MAX_DEPTH`) instead of `max_ref_depth` copies. None when the rule matches nothing."""
        assert self.rules is not None, "recursive calls need rules"
        number = self.ref_rules.get(key)
        if number is None:
            number = self.ref_rules[key] = self._new_rule(pointer)
            self.defining.append(key)
            start, built = self.work_counters(), self.built_work
            try:
                rx = build()
            finally:
                self.defining.pop()
            # (work done once, not again where a translation that built the rule is reused: `reuse.py`; the rules
            # built inside this one are in its count already)
            self.built_work = tuple(b + now - s for b, now, s in zip(built, self.work_counters(), start))
            self._define_rule(number, rx, pointer)
            self._built[number] = rx
        if key in self.defining:
            self._recursive.add(number)
        elif self.rule_texts[number - 1] is None:
            return None
        return self._call(number)

    def ref_rule(self, target: str, schema: Any, pointer: str) -> Rx | None:
        """The `$ref` target `target` as a rule (translated once, with only `target` on the reference stack, so a
        deeper entry calls the rule: recursion is a rule calling itself, and mutually recursive definitions cost
        one translation each instead of one per path); a small rule that does not call itself is written in
        place instead."""

        def build() -> Rx | None:
            outer, self.ref_stack = self.ref_stack, [target]
            try:
                return self.sub(schema, pointer)
            finally:
                self.ref_stack = outer

        call = self.recursive_call(target, build, pointer)
        number = self.ref_rules[target]
        built = self._built.get(number)
        if call is not None and built is not None and number not in self._recursive and built.cost < self.min_rule_cost:
            self._called.discard(number)  # (never called: small and not recursive, so always written in place)
            return built
        return call

    def _new_rule(self, pointer: str) -> int:
        self.rule_texts.append(None)
        if len(self.rule_texts) >= MAX_RULES:
            raise SchemaTooComplexError(f"the grammar for {pointer or '#'!r} needs more than {MAX_RULES - 1:,} "
                                        "rules; simplify the schema")
        return len(self.rule_texts)

    def _define_rule(self, number: int, rx: Rx | None, pointer: str) -> None:
        if rx is None:  # (a rule that matches nothing: its calls lead nowhere; the mark byte is dead in rules)
            self.rule_texts[number - 1] = None
            return
        self.rules_cost += rx.cost
        if self.rules_cost > GRAMMAR_BUDGET * self.max_cost:
            raise SchemaTooComplexError(
                f"the grammar for {pointer or '#'!r} needs more than {GRAMMAR_BUDGET * self.max_cost:,} of regex "
                f"budget across its {len(self.rule_texts)} rules ({GRAMMAR_BUDGET} x max_cost); simplify the schema "
                "(fewer alternatives, smaller maxItems/maxLength), or raise max_cost"
            )
        self.rule_texts[number - 1] = rx.text

    def grammar_rules(self) -> tuple[str, ...]:
        """The rules' texts, rule 1 first (one that matches nothing, or that no text calls: a text no JSON
        matches, which costs nothing to compile): `Grammar(root, ctx.grammar_rules())`."""
        return tuple(_NOTHING if text is None or n not in self._called else text
                     for n, text in enumerate(self.rule_texts, start=1))

    def _call(self, number: int) -> Rx:
        self._called.add(number)
        return Rx(raw(call_regex(number)).text, _CALL_COST)
