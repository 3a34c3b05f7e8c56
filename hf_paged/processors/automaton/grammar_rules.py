"""The rules of a grammar (`grammar.Grammar`) as byte automata: each compiled by `build_pending` (anchored, counted
and checked at once), its table written and its call edges read off and cut out on first need (`Rule`). A call to
a missing rule is refused at once, from the calls its text spells (`call_graph`). Immutable, memoised per
grammar and per rule text: validation and the build share them, the ladder's tries and other grammars share rules
of the same text, and every `GrammarDFA` of the grammar names its own states over them."""

from __future__ import annotations

import threading
from collections import OrderedDict

import numpy as np

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.errors import InvalidRegexError
from hf_paged.processors.automaton.byte_dfa import ByteDFA, PendingDFA, anchored, build_pending, byte_sets
from hf_paged.processors.automaton.call_graph import call_graph
from hf_paged.processors.automaton.grammar import DIGITS, MARK, WIDTH, Grammar
from hf_paged.processors.budget import CompileBudget

__all__ = ["Rule", "TableLoops", "grammar_rules"]


class TableLoops:
    """`loops` / `has_loops` of a rule's `table`, derived on first need (a `Rule`, or a copy pruned near the nesting
    limit, `grammar_depth.PrunedRule`; each has `_loops` / `_has_loops` slots)."""

    __slots__ = ()

    @property
    def loops(self) -> np.ndarray:
        """uint64 [S + 1, 4]: the bytes that keep a state where it is. Derived on first need (when decoding first
        builds the rule's rows): most rules of a big grammar are not reached by the first mask, and the compile
        never reads them. (Computed twice by two threads at once: the same value.)"""
        if self._loops is None:
            table = self.table
            states = np.arange(table.shape[0], dtype=np.int32)[:, None]
            self._loops = byte_sets(table == states)
        return self._loops

    @property
    def has_loops(self) -> np.ndarray:
        """bool [S + 1]: whether a state has any byte in `loops`."""
        if self._has_loops is None:
            self._has_loops = self.loops.any(axis=1)
        return self._has_loops


class Rule(TableLoops):
    """One rule's automaton, its call edges taken out. Its table is written on first need (`table`, `dead`,
    `finals`, `calls`, `has_calls` all wait for it): the compile counts every rule's work, but the first mask reaches
    few rules, and `IndexCache`'s background step (`TokenIndex.prepare`) writes the others' before decoding meets
    them. Read only once written (shared by equal rule texts); written once, under `_WRITE_LOCK`."""

    __slots__ = ("_calls", "_dead", "_finals", "_has_calls", "_has_loops", "_loops", "_pending", "_table",
                 "initial", "multibyte", "nbytes")

    def __init__(self, dfa: ByteDFA | PendingDFA) -> None:
        self._pending: ByteDFA | PendingDFA | None = dfa  # what the table is written from (None once written)
        self.initial = 0
        self.nbytes = (dfa.num_states + 1) * 256 * 4  # the table's size, at most (the memo's running total)
        self._table: np.ndarray | None = None  # int32 [S + 1, 256]; the mark byte's column is dead
        self._dead = 0
        self._finals: np.ndarray | None = None  # bool [S + 1]
        self._calls: dict[int, list[tuple[int, int]]] = {}  # state -> [(callee rule, state to return to)]
        self._has_calls: np.ndarray | None = None  # bool [S + 1]
        self.multibyte: np.ndarray | None = None  # `utf8.multibyte_ends` of every state, on first need
        self._loops: np.ndarray | None = None  # `loops`, on first need
        self._has_loops: np.ndarray | None = None  # `has_loops`, on first need

    def _write(self) -> None:
        """The table, its call edges read off and cut out in place (the rule owns its automaton)."""
        with _WRITE_LOCK:
            pending = self._pending
            if pending is None:  # (another thread wrote it)
                return
            dfa = pending if isinstance(pending, ByteDFA) else pending.byte_dfa()
            table, dead = dfa.transitions, dfa.dead
            calls = _call_edges(table, dead)
            if calls:
                table[:, MARK] = dead
            has_calls = np.zeros(table.shape[0], dtype=bool)
            has_calls[list(calls)] = True
            self._dead, self._finals, self._calls, self._has_calls = dead, dfa.finals, calls, has_calls
            self._table = table  # (last: a reader that sees the table sees the rest)
            self._pending = None

    @property
    def table(self) -> np.ndarray:
        """int32 [S + 1, 256]: the rule's byte automaton (read only), its mark column dead."""
        if self._table is None:
            self._write()
        return self._table  # type: ignore[return-value]

    @property
    def dead(self) -> int:
        if self._table is None:
            self._write()
        return self._dead

    @property
    def finals(self) -> np.ndarray:
        """bool [S + 1]."""
        if self._table is None:
            self._write()
        return self._finals  # type: ignore[return-value]

    @property
    def calls(self) -> dict[int, list[tuple[int, int]]]:
        """state -> [(callee rule, state to return to)]."""
        if self._table is None:
            self._write()
        return self._calls

    @property
    def has_calls(self) -> np.ndarray:
        """bool [S + 1]: whether a state has a call edge."""
        if self._table is None:
            self._write()
        return self._has_calls  # type: ignore[return-value]


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
    dfa = build_pending(anchored(text), budget)  # (its own, its table written on first need: `Rule`)
    rule = Rule(dfa)
    global _texts_bytes
    with _RULES_LOCK:
        if text not in _TEXTS:
            _TEXTS[text] = (rule, dfa.work)
            _texts_bytes += rule.nbytes
        while len(_TEXTS) > _TEXTS_SIZE or (len(_TEXTS) > 1 and _texts_bytes > _TEXTS_BYTES):
            _texts_bytes -= _TEXTS.popitem(last=False)[1][0].nbytes
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
_WRITE_LOCK = threading.Lock()  # a rule's table written once (`Rule._write`), whichever thread needs it first
renew_locks_after_fork(globals(), "_RULES_LOCK", "_WRITE_LOCK")  # a forked child gets free locks (after_fork.py)


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
    graph = call_graph(grammar)  # (the scan `productive` made of the same grammar, memoised)
    for number, rule in enumerate(rules):
        if graph.spelled[number] and all(0 < callee < len(rules) for callee in graph.callees[number]):
            # every call the text spells names a rule of the grammar, and it spells no mark byte another way: its
            # automaton's call edges, a subset of those (rule texts match no raw mark byte themselves,
            # `grammar.py`), name rules of the grammar too, and the table waits for its first need
            continue
        for targets in rule.calls.values():
            for callee, _ in targets:
                if not 0 < callee < len(rules):
                    raise InvalidRegexError(f"rule {number} calls rule {callee}, which the grammar does not have")
    with _RULES_LOCK:
        _RULES[grammar] = (rules, budget.work - before)
        while len(_RULES) > _RULES_SIZE:
            _RULES.popitem(last=False)
    return rules
