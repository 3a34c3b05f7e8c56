"""The rules of a grammar (`grammar.Grammar`) as byte automata: each compiled by `build_byte_dfa` (anchored), its
call edges read off and cut out. Immutable, memoised per grammar: validation and the build share
them, and every `GrammarDFA` of the grammar names its own states over them."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from hf_paged.errors import InvalidRegexError
from hf_paged.processors.automaton.byte_dfa import anchored, build_byte_dfa
from hf_paged.processors.automaton.grammar import DIGITS, MARK, WIDTH, Grammar
from hf_paged.processors.budget import CompileBudget

__all__ = ["Rule", "grammar_rules"]


@dataclass(slots=True)
class Rule:
    """One rule's automaton, its call edges taken out."""

    table: np.ndarray  # int32 [S + 1, 256]; the mark byte's column is dead (read only: may be the memoised DFA's)
    dead: int
    initial: int
    finals: np.ndarray  # bool [S + 1]
    loops: np.ndarray  # uint64 [S + 1, 4]: the bytes that keep a state where it is
    has_loops: np.ndarray  # bool [S + 1]
    calls: dict[int, list[tuple[int, int]]]  # state -> [(callee rule, state to return to)]
    has_calls: np.ndarray  # bool [S + 1]
    multibyte: np.ndarray | None = None  # `utf8.multibyte_ends` of every state, on first need


def _compile_rule(text: str, budget: CompileBudget) -> Rule:
    dfa = build_byte_dfa(anchored(text), budget=budget)
    table, dead = dfa.transitions, dfa.dead
    calls = _call_edges(table, dead)
    if calls:  # the mark edges cut out of a copy (the automaton is memoised: shared); without them, no copy at all
        table = table.copy()
        table[:, MARK] = dead
    has_calls = np.zeros(table.shape[0], dtype=bool)
    has_calls[list(calls)] = True
    return Rule(table, dead, dfa.initial, dfa.finals.copy(), dfa.loops, dfa.loops.any(axis=1), calls, has_calls)


def _call_edges(table: np.ndarray, dead: int) -> dict[int, list[tuple[int, int]]]:
    """state -> [(callee, state after the call's digits)], for every state with a mark edge: the mark, then WIDTH
    digit bytes, read for all calling states at once (paths in digit order, as the call's number grows)."""
    owners = np.flatnonzero(table[:-1, MARK] != dead)  # (one path per owner to start with, owners ascending)
    calls: dict[int, list[tuple[int, int]]] = {owner: [] for owner in owners.tolist()}  # (a mark with no call: [])
    at = table[owners, MARK].astype(np.int64)
    number = np.zeros(owners.shape[0], dtype=np.int64)
    digits = np.asarray(DIGITS)
    for _ in range(WIDTH):
        after = table[at[:, None], digits]  # [paths, digits] (gathered alone: whole rows are 1 KB each)
        path, digit = np.nonzero(after != dead)  # (row-major: each path's digits in order, paths in order)
        owners, at, number = owners[path], after[path, digit].astype(np.int64), number[path] * len(DIGITS) + digit
    for owner, callee, state in zip(owners.tolist(), number.tolist(), at.tolist()):
        calls[owner].append((callee, state))
    return calls


_RULES: OrderedDict[Grammar, tuple[list[Rule], int]] = OrderedDict()  # grammar -> its rules, their work (`ByteDFA.work`)
_RULES_SIZE = 8
_RULES_LOCK = threading.Lock()


def grammar_rules(grammar: Grammar, budget: CompileBudget | None = None) -> list[Rule]:
    """The rules of a grammar, memoised (they are immutable; every `GrammarDFA` has its own states); their
    automata are built against `budget` (a memoised grammar charges their work again: the same outcome either way).

    Raises:
        InvalidRegexError: a rule that does not compile, or a call to a missing rule.
        TypeError: `grammar` is not a `Grammar`.
        SchemaTooComplexError, UnsatisfiableSchemaError: see `build_byte_dfa`.
    """
    if not isinstance(grammar, Grammar):
        raise TypeError(f"grammar_rules takes a Grammar, got {type(grammar).__name__}")
    budget = budget if budget is not None else CompileBudget()
    with _RULES_LOCK:
        hit = _RULES.get(grammar)
        if hit is not None:
            _RULES.move_to_end(grammar)
    if hit is not None:
        budget.spend("work", hit[1])
        return hit[0]
    before = budget.work
    rules = [_compile_rule(text, budget) for text in grammar.texts]
    for number, rule in enumerate(rules):
        for targets in rule.calls.values():
            for callee, _ in targets:
                if not 0 < callee < len(rules):
                    raise InvalidRegexError(f"rule {number} calls rule {callee}, which the grammar does not have")
    with _RULES_LOCK:
        _RULES[grammar] = (rules, budget.work - before)
        while len(_RULES) > _RULES_SIZE:
            _RULES.popitem(last=False)
    return rules
