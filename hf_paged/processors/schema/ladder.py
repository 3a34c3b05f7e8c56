"""The translation ladder: JSON Schema -> regex (or grammar), trying exact first, then smaller automata.

Each try translates the schema with different caps (`_Attempt`) and builds its automata; the first try whose
translation and automata fit the budget wins. Every limit counts work (`CompileBudget`: sub-schemas visited,
instance checks, automaton states and steps), never seconds, so one schema has one outcome on any machine under
any load. Entry points of the schema layer: `schema_to_regex`, `schema_to_grammar`.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass

from hf_paged.errors import InvalidSchemaError, SchemaTooComplexError, UnsatisfiableSchemaError
from hf_paged.processors.automaton import Grammar, check_automaton
from hf_paged.processors.automaton.productive import prune_dead_rules
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.schema.context import DEFAULT_WHITESPACE, MIN_RULE_COST, Context, CutShort
from hf_paged.processors.schema.digits import NumberDigits
from hf_paged.processors.schema.reuse import Reach
from hf_paged.processors.schema.translate import translate

__all__ = ["schema_to_grammar", "schema_to_regex"]

_SKIP_EXACT = 10  # once the automata built so far used a tenth of `max_work`, exact tries give way to pruning ones


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
    number_digits: NumberDigits | None = None,
    strict: bool = True,
    max_cost: int = 100_000,
    max_ref_depth: int = 3,
    max_repeat: int = 32,
    max_string_repeat: int = 256,
    undeclared_keys: bool = True,
    budget: CompileBudget | None = None,
) -> str:
    """Translate a JSON Schema into a regex whose every match is a JSON text valid under the schema.

    Args:
        schema: the schema (dict or boolean).
        whitespace: regex of the whitespace allowed between tokens; None: `[ ]?` (bounded).
        number_digits: most digits in a number's integer part, fraction and exponent (`NumberDigits`), everywhere
            the schema leaves them open; None: the default, `DEFAULT_DIGITS` (fraction and exponent digits of
            numbers without bounds only: no double value needs more).
        strict: raise `UnsupportedSchemaError` on keywords we cannot enforce; False: warn and drop them.
        max_cost: budget of the estimated automaton size; above it `SchemaTooComplexError`.
        max_ref_depth: times one `$ref` may be entered on one path (recursion is cut off beyond, soundly).
        max_repeat: counted repetitions above this are lowered to it (fewer texts, all still valid).
        max_string_repeat: the same for string lengths (`maxLength`, counted `pattern` repeats).
        undeclared_keys: let objects that declare properties but say nothing of `additionalProperties` also
            carry undeclared keys, after the declared ones, as JSON Schema allows (default); False: only the
            declared keys (a subset of the valid documents, as in xgrammar's and OpenAI's strict modes).
        budget: the work budget of the translation (all tries together) and of the automata each try builds
            (`CompileBudget`, counts of work: the same outcome on any machine); default `CompileBudget()`.

    Raises:
        InvalidSchemaError, UnsupportedSchemaError, UnsatisfiableSchemaError, InvalidRegexError,
        SchemaTooComplexError (all from `hf_paged.errors`).
    """
    return _translate_ladder(schema, False, whitespace, strict, max_cost, max_ref_depth, max_repeat,
                             max_string_repeat, undeclared_keys, budget, number_digits)


def schema_to_grammar(
    schema: dict | bool,
    *,
    whitespace: str | None = None,
    number_digits: NumberDigits | None = None,
    strict: bool = True,
    max_cost: int = 100_000,
    max_ref_depth: int = 3,
    max_repeat: int = 32,
    max_string_repeat: int = 256,
    undeclared_keys: bool = True,
    budget: CompileBudget | None = None,
) -> str | Grammar:
    """`schema_to_regex`, but a schema whose flat regex is over `max_cost`, or would allow less than the schema
    (undeclared keys beside declared ones, free values nested past two levels, recursion past `max_ref_depth`), is
    written as a `Grammar` (big values and `$ref` targets as rules that every use calls)
    before anything is capped or left out. What the processors compile (`automaton.build_automaton` takes both
    forms). Same arguments and errors as `schema_to_regex`."""
    return _translate_ladder(schema, True, whitespace, strict, max_cost, max_ref_depth, max_repeat,
                             max_string_repeat, undeclared_keys, budget, number_digits)


def _translate_ladder(schema: dict | bool, calls: bool, whitespace: str | None, strict: bool, max_cost: int,
                      max_ref_depth: int, max_repeat: int, max_string_repeat: int, undeclared_keys: bool,
                      budget: CompileBudget | None, number_digits: NumberDigits | None = None) -> str | Grammar:
    if number_digits is not None and not isinstance(number_digits, NumberDigits):
        raise TypeError(f"number_digits must be a NumberDigits or None, got {type(number_digits).__name__}; give "
                        "e.g. NumberDigits(integer=18, fraction=12, exponent=3)")
    if not isinstance(schema, (dict, bool)):
        raise InvalidSchemaError(f"a JSON Schema is an object or a boolean, got {type(schema).__name__}; "
                                 "pass a dict (parse JSON text with json.loads first)")
    ws = DEFAULT_WHITESPACE if whitespace is None else whitespace
    budget = budget if budget is not None else CompileBudget()
    # Exact first, with undeclared keys allowed in open objects; then without them (each open object's free
    # key-value loop is the costliest part of most real schemas); then spell counted strings below U+0800 only
    # (a third of their automaton: each counted character has its own UTF-8 continuation states); then cap counted repetitions (a DFA unrolls
    # `x{0,64}` into 64 copies of x, and real documents rarely come near such bounds) and recursion (each level
    # copies every recursive reference of the level above); only then leave out optional members / alternatives,
    # capping repetitions and recursion harder.
    # The first tries get a sixteenth / an eighth of the cost budget: free values after every open object inflate
    # the byte DFA faster than the cost estimate grows (measured: 2.6k -> 49k regex characters, 12 ms -> 4.8 s CPU).
    # Every try builds its automata (memoised: the processors reuse the last try's), their work counted; a try
    # over an automaton's limit moves on to the next, and past the compile's totals (`budget.exhausted`) none can
    # succeed: the error is raised.
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
    checked: dict[str, list[int]] = {}  # instance checks, shared by every try (`Context.checked`)
    finite: dict = {}  # the regexes of finite domains, shared too (`Context.finite`)
    ref_index: dict = {}  # the document's `$id`s and anchors, indexed once for every try (`Context.ref_index`)
    resolved: dict = {}  # its local `$ref`s, resolved once for every try (`Context.resolved`)
    reach = Reach()  # the `$ref` targets each node can reach, for every try (`Context.reach`)
    failures: set[tuple] = set()  # (pointer, cost) of the cost failures of full-budget tries
    stuck: bool | None = None  # False: the non-pruning tries cannot help
    automaton_error: SchemaTooComplexError | None = None  # the first automaton over its limits
    too_many_visits: tuple[SchemaTooComplexError, int] | None = None  # (error, recursion depth it happened at)
    cost_failure: tuple[tuple, int] | None = None  # (settings, cost) of the last stop-at-cut try over its cost budget
    dead_root: UnsatisfiableSchemaError | None = None  # a pruning try's grammar whose root never ends

    def make_context(attempt: _Attempt, stop_at_cut: bool = False) -> Context:
        return Context(root=schema, strict=strict, max_cost=attempt.max_cost, max_ref_depth=attempt.ref_depth,
                       max_repeat=attempt.repeat, max_string_repeat=attempt.string_repeat,
                       extras_beside_declared=attempt.extras, narrow_strings=attempt.narrow, whitespace=ws,
                       number_digits=number_digits,
                       translate=translate, prune_cost=attempt.prune_cost, undeclared_keys=undeclared_keys,
                       any_depth=attempt.any_depth, rules={} if attempt.calls else None,
                       min_rule_cost=attempt.rule_cost, budget=budget, checked=checked, ref_index=ref_index,
                       resolved=resolved, stop_at_cut=stop_at_cut, reach=reach, finite=finite)

    cut_tries: list[_Attempt] = []  # with calls: flat tries from the first that cut (the fallback: `_first_cut`)
    for n, attempt in enumerate(attempts):
        if cut_tries and (attempt.narrow or attempt.prune_cost is not None):
            # no grammar fits: a flat regex that cuts a little beats one that leaves members out (translated in full
            # only now: a grammar usually fits, and the flat regex is the biggest automaton of the ladder)
            try:
                cut = _first_cut(cut_tries, make_context, budget)
                cut_tries = []
                if cut is not None:
                    check_automaton(cut, budget)
                    return cut
            except SchemaTooComplexError:
                if budget.exhausted():
                    raise
                cut_tries = []
        if cut_tries and not attempt.calls and not attempt.narrow and attempt.prune_cost is None:
            cut_tries.append(attempt)  # a later flat try cuts at least as much (less nesting, fewer extras)
            continue
        if attempt.prune_cost is None and n >= num_exact and budget.work > budget.max_work // _SKIP_EXACT:
            continue  # costly translations go straight to the pruning tries, which fit the budget sooner
        if too_many_visits is not None and attempt.ref_depth >= too_many_visits[1]:
            continue  # caps and pruning translate every sub-schema all the same: only less recursion visits fewer
        if stuck is not None and (attempt.prune_cost is not None) == stuck:
            continue  # the same fragment failed twice whatever these tries change: on to the pruning ones
        # A flat try that cuts anything is set aside while exact grammars remain: it stops at its first cut
        stop_at_cut = calls and not attempt.calls and not attempt.narrow
        settings = (attempt.prune_cost, attempt.repeat, attempt.string_repeat, attempt.ref_depth, attempt.extras)
        if stop_at_cut and cost_failure is not None and cost_failure[0] == settings and cost_failure[1] > attempt.max_cost:
            # Two tries that stop at their first cut and differ only in `max_cost` (and `any_depth`, which only a
            # free value reads, after its cut) write the same fragments up to the first one over budget: this one
            # would meet the same fragment, at the same cost, over its budget too
            continue
        ctx = make_context(attempt, stop_at_cut=stop_at_cut)
        try:
            rx = translate(schema, ctx, "#")
            text = None if rx is None else _grammar(rx.text, ctx) if ctx.rule_texts else rx.text
            if text is not None:
                check_automaton(text, budget)  # (memoised for the processors; over a limit: the next try)
        except CutShort:
            cut_tries.append(attempt)
            continue
        except _PrunedToNothing as exc:
            dead_root = exc.error  # (what this try left out was the recursion's way out: a later try may keep it)
            continue
        except SchemaTooComplexError as exc:
            if n == len(attempts) - 1 or budget.exhausted():
                if automaton_error is not None and automaton_error is not exc:  # (the first cause is the telling one)
                    raise automaton_error from exc
                raise
            if automaton_error is None and getattr(exc, "pointer", None) is None and ctx.num_visits <= ctx.max_visits:
                automaton_error = exc  # an automaton over its own limits (states, steps): what to tell if all fail
            if ctx.num_visits > ctx.max_visits:
                too_many_visits = (exc, attempt.ref_depth)
            # a fragment over the full cost budget that an earlier try met with the very same cost: what the tries
            # of this kind change (caps, recursion, rules) does not touch it; only pruning might (`Context.check_cost`)
            failure = (getattr(exc, "pointer", None), getattr(exc, "cost", None))
            if stop_at_cut and failure[1] is not None:
                cost_failure = (settings, failure[1])
            if failure[0] is not None and attempt.max_cost == max_cost:
                if failure in failures:
                    if attempt.prune_cost is not None:
                        raise  # pruning did not touch it either
                    stuck = False
                failures.add(failure)
            continue  # retry, leaving out optional members and alternatives to fit the budget
        if rx is None or text is None:
            found = f"; parts that allow no value: {'; '.join(ctx.empty)}" if ctx.empty else ""
            raise UnsatisfiableSchemaError("no JSON document satisfies this schema (or every way to satisfy it "
                                           f"needs recursion deeper than max_ref_depth); check its constraints{found}")
        if ctx.num_pruned or attempt.narrow:
            capped = (f"over the regex budget ({max_cost:,}): counted repetitions capped at {attempt.repeat} items / "
                      f"{attempt.string_repeat} characters (below U+0800); " if attempt.narrow else "")
            warnings.warn(f"{capped}left out {ctx.num_pruned} optional properties / anyOf branches / items of unique "
                          "arrays beyond the first (a regex cannot compare items); output stays valid but cannot use "
                          "them (raise max_cost to keep what the budget left out)", UserWarning, stacklevel=3)
        return text
    if cut_tries:
        cut = _first_cut(cut_tries, make_context, budget)
        if cut is not None:
            check_automaton(cut, budget)
            return cut
    if too_many_visits is None and dead_root is not None:
        raise SchemaTooComplexError(
            f"the schema is over the regex budget ({max_cost:,}), and the tries that fit it left out what ends its "
            "recursion (an optional member or an anyOf branch that does not refer back): raise max_cost, or make the "
            "recursion's way out its first anyOf branch") from dead_root
    assert too_many_visits is not None, "only skipped tries end the loop without a result"
    raise too_many_visits[0]


class _PrunedToNothing(Exception):
    """A try that left members out (`Context.num_pruned`) wrote a grammar whose root never ends (`error`)."""

    def __init__(self, error: UnsatisfiableSchemaError) -> None:
        super().__init__(str(error))
        self.error = error


def _grammar(root: str, ctx: Context) -> Grammar:
    """The try's grammar without the rules that never end (`prune_dead_rules`: a call to one matches nothing).

    Raises:
        UnsatisfiableSchemaError: its root never ends, all of the schema kept (no finite document is valid).
        _PrunedToNothing: its root never ends, but the try left members out (perhaps the recursion's way out).
    """
    try:
        return prune_dead_rules(Grammar(root, ctx.grammar_rules()))
    except UnsatisfiableSchemaError as exc:
        if ctx.num_pruned:
            raise _PrunedToNothing(exc) from None
        raise


def _first_cut(tries: list[_Attempt], make_context: Callable[[_Attempt], Context], budget: CompileBudget) -> str | None:
    """The flat regex of the first of `tries` whose translation fits (each cuts something: the schema's fallback when
    no exact grammar fits), or None when none does.

    Raises:
        SchemaTooComplexError: the compile's work budget ran out.
    """
    for attempt in tries:
        ctx = make_context(attempt)
        try:
            rx = translate(ctx.root, ctx, "#")
        except SchemaTooComplexError:
            if budget.exhausted():
                raise
            continue
        if rx is not None:
            return rx.text
    return None
