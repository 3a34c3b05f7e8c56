"""Rules that can end, read off a grammar's rule texts (`grammar.Grammar`), and the grammar without the others.

A rule whose every path passes a call to a rule that never ends matches no finite text: a `$ref` cycle with no
branch that stops (`{"properties": {"a": {"$ref": "#"}}, "required": ["a"]}`). Its automaton still has states and
its first bytes still pass the mask, so a generation that enters it runs to `max_new_tokens`. The rules that can
end are the least fixed point of "some alternative whose calls all go to rules that can end" (the productive
nonterminals of a context-free grammar; `lark/recursion.py` computes the same on Lark's nodes):

    texts --call graph (`call_graph`, one scan that `grammar_rules` shares)--> a cycle?
              no: nothing to do (every rule ends whose own text does)
              yes: components callees first; a rule on a cycle (or calling a rule found dead) as a formula over
                   its calls (and / or / true / false: `_formula` token by token, or `formula_arrays` for long
                   texts), the least fixed point; `prune_dead_rules` then drops the rules that never end

A call to a dropped rule becomes `NOTHING` (a class of no character), so the automaton never lets a model into it;
a root that never ends is refused (`UnsatisfiableSchemaError`). Read from the texts, never from the rules' tables:
those are written lazily (`grammar_rules.Rule`), and most of them are never needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors.automaton.call_graph import call_graph, call_number, components
from hf_paged.processors.automaton.formula_arrays import all_of as _and
from hf_paged.processors.automaton.formula_arrays import any_of as _or
from hf_paged.processors.automaton.formula_arrays import formulas_from_arrays
from hf_paged.processors.automaton.grammar import Grammar, call_regex, describe

__all__ = ["NOTHING", "Productivity", "never_ending_rules", "productivity", "prune_dead_rules"]

NOTHING = r"[^\x00-\U0010ffff]"  # a class of no character: what a call to a rule that never ends becomes

_MARKER = re.compile(r"\\x02(?:\\x[0-9a-f]{2}){3}")  # a call as `call_regex` spells it
_NOTHING_RE = re.escape(NOTHING)
# What the formula needs of a regex: calls, the empty class, groups, alternatives and the least count of each
# quantifier; everything else (literals, escapes, classes, anchors) is some text, true. A quantifier binds to the
# token before it, so an escape, a class and a call are single tokens; runs of plain characters are one token too
# (true either way: a quantifier on their last character leaves them true).
_TOKEN = re.compile(
    rf"""(?P<call>\\x02(?:\\x[0-9a-f]{{2}}){{3}})
      | (?P<nothing>{_NOTHING_RE})
      | (?P<open>\((?:\?(?:P?<[A-Za-z_][A-Za-z0-9_]*>|[a-zA-Z]*:))?)
      | (?P<close>\))
      | (?P<bar>\|)
      | (?P<quant>(?:[*?]|\+|\{{(?P<lo>[0-9]+)(?:,[0-9]*)?\}})[?+]?)
      | (?P<atom>\[\^?\]?(?:\\.|[^\]\\])*\]|\\.|[^\\()|*+?{{\[]+|.)""",
    re.VERBOSE | re.DOTALL,
)

# A formula: True / False, a rule number (a call: true when that rule can end), or ("&" | "|", formulas).
Formula = bool | int | tuple


@dataclass(frozen=True, slots=True)
class Productivity:
    """Which rules of a grammar can end (match some finite text)."""

    has_cycle: bool  # some rule calls itself through others (without one, every rule with a text that ends ends)
    never_end: tuple[int, ...]  # the rules no finite text matches, ascending (0: the root)


def _formula(text: str) -> Formula:
    """When `text` matches some finite text, as a formula over the rules it calls. Syntax it cannot follow (an
    unbalanced group) reads as true: the rule is kept, as before this analysis."""
    groups: list[tuple[list[Formula], list[Formula]]] = []  # enclosing groups: (alternatives done, this one's items)
    alternatives: list[Formula] = []
    items: list[Formula] = []
    for match in _TOKEN.finditer(text):
        kind = match.lastgroup
        if kind == "atom":
            items.append(True)
        elif kind == "call":
            number = call_number(match.group()[4:])
            items.append(True if number is None else number)  # (not a rule's number: as before, kept)
        elif kind == "nothing":
            items.append(False)
        elif kind == "quant":
            if not items:
                return True
            lo = match.group("lo")
            if match.group()[0] in "*?" or (lo is not None and int(lo) == 0):
                items[-1] = True  # (zero copies: the empty text)
        elif kind == "bar":
            alternatives.append(_and(items))
            items = []
        elif kind == "open":
            groups.append((alternatives, items))
            alternatives, items = [], []
        else:  # close
            if not groups:
                return True
            group = _or([*alternatives, _and(items)])
            alternatives, items = groups.pop()
            items.append(group)
    if groups:
        return True
    return _or([*alternatives, _and(items)])


def _holds(formula: Formula, ends: set[int]) -> bool:
    if formula is True or formula is False:
        return formula
    if isinstance(formula, int):
        return formula in ends
    if formula[0] == "&":
        return all(_holds(item, ends) for item in formula[1])
    return any(_holds(item, ends) for item in formula[1])


def productivity(grammar: Grammar) -> Productivity:
    """Which rules of `grammar` can end. One scan of the texts for their calls, and the call graph's components;
    then, callees first, a formula only for the rules on a cycle (most grammars: the free-value rule alone) and for
    the rare rule that calls a rule that never ends. Without a cycle every rule ends whose own text does
    (`grammar_rules` refuses a text that matches nothing)."""
    texts = grammar.texts
    graph = call_graph(grammar)
    callees = graph.callees
    parts = components(graph) if any(callees) else []
    if not any(len(part) > 1 or part[0] in callees[part[0]] for part in parts):
        return Productivity(False, ())
    _read_formulas([texts[number] for part in parts if len(part) > 1 or part[0] in callees[part[0]]
                    for number in part])
    dead: set[int] = set()
    # (callees first: every rule a component calls outside it is decided; a call to a missing rule counts as one
    # that ends, for `grammar_rules` to refuse)
    ends = set(range(len(texts))).union(*callees)
    for component in parts:
        if len(component) == 1 and component[0] not in callees[component[0]]:
            number = component[0]
            if callees[number] & dead and not _holds(_formula_of(texts[number]), ends):
                dead.add(number)
                ends.discard(number)
            continue
        members = {number: _formula_of(texts[number]) for number in component}
        ends.difference_update(members)
        callers: dict[int, list[int]] = {number: [] for number in component}  # (within the component)
        for number in component:
            for callee in callees[number]:
                if callee in callers:
                    callers[callee].append(number)
        todo = list(component)  # (a worklist: a member is read again only when one of its callees ends)
        while todo:
            number = todo.pop()
            if number not in ends and _holds(members[number], ends):
                ends.add(number)
                todo.extend(caller for caller in callers[number] if caller not in ends)
        dead.update(number for number in component if number not in ends)
    return Productivity(True, tuple(sorted(dead)))


def _formula_of(text: str) -> Formula:
    """`_formula`, memoised by text (the free-value rule's text recurs in most grammars)."""
    formula = _FORMULAS.get(text)
    if formula is None:
        formula = _formula(text)
        if len(_FORMULAS) >= _FORMULAS_SIZE:
            _FORMULAS.clear()
        _FORMULAS[text] = formula
    return formula


def _read_formulas(texts: list[str]) -> None:
    """The formulas of the rules on cycles into the memo: read together with array operations when they are long
    (`formula_arrays`: ~0.2 ms, then ~0.04 us a character; the token reader ~0.15 us a character), one by one
    otherwise."""
    missing = [text for text in texts if text not in _FORMULAS]
    if sum(map(len, missing)) < _ARRAYS_FROM:
        return
    formulas = formulas_from_arrays(missing)
    if formulas is None:
        return  # (syntax the array reader leaves: `_formula_of` reads them one by one)
    if len(_FORMULAS) + len(missing) > _FORMULAS_SIZE:
        _FORMULAS.clear()
    _FORMULAS.update(zip(missing, formulas))


_FORMULAS: dict[str, Formula] = {}  # rule text -> its formula (a value: shared by threads, a race only recomputes)
_FORMULAS_SIZE = 1024
_ARRAYS_FROM = 1536  # characters of unread formulas from which they are read with array operations (`formula_arrays`)


def never_ending_rules(grammar: Grammar) -> list[int]:
    """The rules of `grammar` no finite text matches, ascending (see `productivity`)."""
    return list(productivity(grammar).never_end)


def prune_dead_rules(grammar: Grammar) -> Grammar:
    """`grammar` without the rules that never end: a call to one becomes `NOTHING`, and the others are
    renumbered. The very object when every rule can end (most grammars: the same key, the same memo entries).

    Raises:
        UnsatisfiableSchemaError: the root never ends (no finite document matches).
    """
    dead = productivity(grammar).never_end
    if not dead:
        return grammar
    if dead[0] == 0:
        raise UnsatisfiableSchemaError(
            f"no document matches the constraint {describe(grammar, 80)}: its rules {list(dead)} never end (every "
            "path goes through a required property or item that refers back to its own schema: the schema's "
            "`$ref`s loop with no branch that stops, such as {\"$ref\": \"#\"} or {\"properties\": {\"a\": "
            "{\"$ref\": \"#\"}}, \"required\": [\"a\"]}); give the recursion a way out: make the property optional "
            "(or `minItems: 0`), or add a non-recursive branch (an anyOf with null)")
    dead_set = set(dead)
    renumbered: dict[int, str] = {}
    for number in range(1, len(grammar.texts)):
        if number not in dead_set:
            renumbered[number] = call_regex(len(renumbered) + 1)

    def rewrite(match: re.Match) -> str:
        number = call_number(match.group()[4:])
        if number in dead_set:
            return NOTHING
        return renumbered.get(number, match.group()) if number is not None else match.group()

    texts = [_MARKER.sub(rewrite, text) if "\\x02" in text else text
             for number, text in enumerate(grammar.texts) if number not in dead_set]
    return Grammar(texts[0], tuple(texts[1:]))
