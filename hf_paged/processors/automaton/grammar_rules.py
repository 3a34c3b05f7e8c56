"""The rules of a grammar (`grammar.Grammar`) as byte automata: each compiled by `build_byte_dfa` (anchored), its
call edges read off and cut out. Immutable, memoised per grammar and per rule text: validation and the build share
them, the ladder's tries and other grammars share rules of the same text, and every `GrammarDFA` of the grammar
names its own states over them."""

from __future__ import annotations

import threading
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from hf_paged.errors import InvalidRegexError
from hf_paged.processors.automaton.byte_dfa import anchored, build_byte_dfa, byte_sets
from hf_paged.processors.automaton.grammar import DIGITS, MARK, WIDTH, Grammar
from hf_paged.processors.budget import CompileBudget

__all__ = ["Rule", "grammar_rules"]


@dataclass(slots=True)
class Rule:
    """One rule's automaton, its call edges taken out."""

    table: np.ndarray  # int32 [S + 1, 256]; the mark byte's column is dead (read only: shared by equal rule texts)
    dead: int
    initial: int
    finals: np.ndarray  # bool [S + 1]
    calls: dict[int, list[tuple[int, int]]]  # state -> [(callee rule, state to return to)]
    has_calls: np.ndarray  # bool [S + 1]
    multibyte: np.ndarray | None = None  # `utf8.multibyte_ends` of every state, on first need
    _loops: np.ndarray | None = None  # `loops`, on first need
    _has_loops: np.ndarray | None = None  # `has_loops`, on first need

    @property
    def loops(self) -> np.ndarray:
        """uint64 [S + 1, 4]: the bytes that keep a state where it is. Derived on first need (when decoding first
        builds the rule's rows): most rules of a big grammar are not reached by the first mask, and the compile
        never reads them. (Computed twice by two threads at once: the same value.)"""
        if self._loops is None:
            states = np.arange(self.table.shape[0], dtype=np.int32)[:, None]
            self._loops = byte_sets(self.table == states)
        return self._loops

    @property
    def has_loops(self) -> np.ndarray:
        """bool [S + 1]: whether a state has any byte in `loops`."""
        if self._has_loops is None:
            self._has_loops = self.loops.any(axis=1)
        return self._has_loops


def _memo_hit(memo: OrderedDict, key, budget: CompileBudget):
    """The memoised value of `key` (now the most recently used), its work charged again to `budget`; None."""
    with _RULES_LOCK:
        hit = memo.get(key)
        if hit is not None:
            memo.move_to_end(key)
    if hit is None:
        return None
    budget.spend("work", hit[1])
    return hit[0]


def _compile_rule(text: str, budget: CompileBudget) -> Rule:
    """`text`'s rule, memoised by text (`_TEXTS`: the ladder's tries and other grammars repeat rules), its work
    charged again on a hit as `build_byte_dfa` charges a memoised automaton's."""
    hit = _memo_hit(_TEXTS, text, budget)
    if hit is not None:
        return hit
    dfa = build_byte_dfa(anchored(text), budget=budget, owned=True)  # (its own: the mark edges are cut in place;
    # its loop sets are left to `Rule.loops`)
    table, dead = dfa.transitions, dfa.dead
    calls = _call_edges(table, dead)
    if calls:
        table[:, MARK] = dead
    has_calls = np.zeros(table.shape[0], dtype=bool)
    has_calls[list(calls)] = True
    rule = Rule(table, dead, dfa.initial, dfa.finals, calls, has_calls)
    global _texts_bytes
    with _RULES_LOCK:
        if text not in _TEXTS:
            _TEXTS[text] = (rule, dfa.work)
            _texts_bytes += table.nbytes
        while len(_TEXTS) > _TEXTS_SIZE or (len(_TEXTS) > 1 and _texts_bytes > _TEXTS_BYTES):
            _texts_bytes -= _TEXTS.popitem(last=False)[1][0].table.nbytes
    return rule


def _call_edges(table: np.ndarray, dead: int) -> dict[int, list[tuple[int, int]]]:
    """state -> [(callee, state after the call's digits)], for every state with a mark edge: the mark, then WIDTH
    digit bytes, read for all calling states at once (paths in digit order, as the call's number grows)."""
    flat = table.reshape(-1)
    width = table.shape[1]
    owners = np.flatnonzero(flat[MARK : (table.shape[0] - 1) * width : width] != dead)  # (owners ascending)
    calls: dict[int, list[tuple[int, int]]] = {owner: [] for owner in owners.tolist()}  # (a mark with no call: [])
    if not calls:
        return calls
    at = flat.take(owners * width + MARK)
    number = np.zeros(owners.shape[0], dtype=np.int64)
    for _ in range(WIDTH):  # (gathered alone, flat: whole rows are 1 KB each)
        after = flat.take((at.astype(np.int64) * width)[:, None] + _DIGITS)  # [paths, digits]
        path, digit = np.nonzero(after != dead)  # (row-major: each path's digits in order, paths in order)
        owners, at, number = owners[path], after[path, digit], number[path] * len(DIGITS) + digit
    for owner, callee, state in zip(owners.tolist(), number.tolist(), at.tolist()):
        calls[owner].append((callee, state))
    return calls


_DIGITS = np.asarray(DIGITS, dtype=np.int64)
_TEXTS: OrderedDict[str, tuple[Rule, int]] = OrderedDict()  # rule text -> its rule, its work (`ByteDFA.work`)
_TEXTS_SIZE = 256  # entries ...
_TEXTS_BYTES = 128 << 20  # ... and bytes of tables kept, whichever is reached first
_texts_bytes = 0  # bytes of the tables in `_TEXTS` (under `_RULES_LOCK`)
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
    hit = _memo_hit(_RULES, grammar, budget)
    if hit is not None:
        return hit
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
