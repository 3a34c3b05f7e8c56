"""The nesting limit of a grammar's call stacks (`MAX_DEPTH` frames) without dead ends near it.

A call is entered only below `MAX_DEPTH` frames. Cutting the calls alone left states from which no text ends:
in `start: "(" start ")" | "x"` the 127th `(` led to a rule state whose only way on is a call, and the model,
offered that `(`, could only stop unfinished. So a rule's states are graded by the levels of calls below it
that the cheapest way to its end needs (`need`: 0 for a text with no call; a call costs 1 + its callee's need
from its start), and a frame with `k` levels left below it (`MAX_DEPTH` - its frame number) keeps only the states
with need <= k: near the limit a rule is a pruned copy of itself (`PrunedRule`, a rule number of its own past the
grammar's), whose edges into the other states go to its dead state and whose calls that cannot end are gone.

    bound        an upper bound on every need, from the call graph alone (`depth_bound`): frames with at least
                 that many levels left need nothing (most grammars never get near: the analysis is never run)
    needs        exact, from the rules' tables, level by level, computed the first time a frame nears the limit
    rule_at      the rule number a frame uses: the rule itself, or its pruned copy for the levels left
"""

from __future__ import annotations

import threading
from collections import deque

import numpy as np

from hf_paged.processors.automaton.call_graph import call_graph, components
from hf_paged.processors.automaton.grammar import Grammar
from hf_paged.processors.automaton.grammar_rules import TableLoops

__all__ = ["MAX_DEPTH", "NestingLimit", "PrunedRule", "depth_bound"]

MAX_DEPTH = 128  # frames a call stack may hold (the root's included)
_NEVER = MAX_DEPTH + 1  # a need no frame has: the state cannot end within the limit


def depth_bound(grammar: Grammar) -> int:
    """An upper bound on the levels of calls below any rule state that its cheapest way to its end needs. A cheapest
    way never enters a rule inside itself (the inner one's way is as cheap), so from a rule's start it passes each
    strongly connected component's members at most once: its members' bound is the component's size - 1, plus
    1 + the largest bound of a callee outside it; a state inside a rule adds one call."""
    graph = call_graph(grammar)
    num_rules = len(graph.callees)
    if not all(graph.spelled):  # (calls spelled some other way: the automaton's edges are the truth)
        return num_rules
    bound = [0] * num_rules
    for part in components(graph):  # (callees' components first)
        members = set(part)
        outside = [1 + bound[c] for m in part for c in graph.callees[m] if c not in members and 0 <= c < num_rules]
        value = len(part) - 1 + max(outside, default=0)
        for member in part:
            bound[member] = value
    return 1 + max(bound)


class PrunedRule(TableLoops):
    """A rule (`grammar_rules.Rule`) cut to the states that can end with `levels` levels of calls below them: the
    same state numbers, edges into the others going to the dead state, calls kept where the callee can end one level
    further down and the state returned to can end (read like a `Rule`)."""

    __slots__ = ("_has_loops", "_loops", "calls", "dead", "finals", "has_calls", "initial", "multibyte", "nbytes",
                 "table")

    def __init__(self, rule, levels: int, need: np.ndarray, start_needs: list[int]) -> None:
        keep = need <= levels  # bool [S + 1] (the dead state: never)
        table = rule.table.copy()
        table[~keep[table]] = rule.dead
        table[~keep] = rule.dead
        self.table, self.dead, self.finals, self.initial = table, rule.dead, rule.finals, rule.initial
        self.calls = {state: [(callee, back) for callee, back in targets
                              if keep[back] and start_needs[callee] <= levels - 1]
                      for state, targets in rule.calls.items() if keep[state]}
        self.has_calls = np.zeros(table.shape[0], dtype=bool)
        self.has_calls[list(self.calls)] = True
        self.multibyte: np.ndarray | None = None  # (`GrammarDFA.multibyte_ends` fills it on first need)
        self.nbytes = table.nbytes
        self._loops: np.ndarray | None = None
        self._has_loops: np.ndarray | None = None


class NestingLimit:
    """Which rule each frame of a call stack uses (`rule_at`) so that every state a stack reaches can still end within
    `MAX_DEPTH` frames. Pruned copies are appended to `rules` (the `GrammarDFA`'s own list) as they are first needed.

    Args:
        rules: the grammar's rules, the root first (extended in place).
        grammar: the grammar (its call graph bounds the needs, `depth_bound`).
    """

    def __init__(self, rules: list, grammar: Grammar) -> None:
        self.rules = rules
        self.num_rules = len(rules)
        self.safe_frames = MAX_DEPTH - depth_bound(grammar)  # frames at or above this never need pruning
        self._needs: list[np.ndarray] | None = None
        self._copies: dict[tuple[int, int], int | None] = {}  # (rule, levels) -> rule number, None: cannot end
        self._lock = threading.Lock()

    def rule_at(self, rule: int, frames: int) -> int | None:
        """The rule number a frame `frames` deep (the root's is 1) uses for rule `rule` entered at its start: `rule`
        itself, or its copy pruned to the levels left; None when its start cannot end within the limit."""
        if frames <= self.safe_frames:
            return rule
        if frames > MAX_DEPTH:
            return None
        key = (rule, MAX_DEPTH - frames)
        found = self._copies.get(key, False)
        if found is False:
            with self._lock:
                found = self._copies.get(key, False)
                if found is False:
                    found = self._copies[key] = self._copy(*key)
        return found

    def _copy(self, rule: int, levels: int) -> int | None:
        needs = self._levels()
        need = needs[rule]
        if need[self.rules[rule].initial] > levels:
            return None
        if need[: self.rules[rule].dead].max(initial=0) <= levels:
            return rule  # (every state can end: the rule itself)
        starts = [int(needs[n][self.rules[n].initial]) for n in range(self.num_rules)]
        self.rules.append(PrunedRule(self.rules[rule], levels, need, starts))
        return len(self.rules) - 1

    def _levels(self) -> list[np.ndarray]:
        """Each rule's need per state (`_NEVER`: none within the limit): level by level, the states from which a
        final state is reached over byte edges and the calls whose callee's start ends a level lower."""
        if self._needs is not None:
            return self._needs
        rules = self.rules[: self.num_rules]
        needs = [np.full(rule.table.shape[0], _NEVER, dtype=np.int64) for rule in rules]
        preds = [_predecessors(rule.table, rule.dead) for rule in rules]
        for levels in range(MAX_DEPTH):
            changed = False
            for number, rule in enumerate(rules):
                if levels and not rule.calls:
                    continue  # (no call: its level 0 is its last)
                calls = [(back, state) for state, targets in rule.calls.items() for callee, back in targets
                         if needs[callee][rules[callee].initial] <= levels - 1]
                reached = _reach(preds[number], np.flatnonzero(rule.finals[: rule.dead]), calls)
                fresh = reached[needs[number][reached] > levels]
                if fresh.shape[0]:
                    needs[number][fresh] = levels
                    changed = True
            if not changed and levels:
                break
        self._needs = needs
        return needs


def _predecessors(table: np.ndarray, dead: int) -> tuple[np.ndarray, np.ndarray]:
    """The byte edges reversed, as (offsets, sources): the states with an edge into state t are
    sources[offsets[t]:offsets[t + 1]]."""
    sources, byte = np.nonzero(table[:dead] != dead)
    targets = table[sources, byte]
    pairs = np.unique(np.stack([targets.astype(np.int64), sources]), axis=1)
    offsets = np.searchsorted(pairs[0], np.arange(dead + 1))
    return offsets, pairs[1]


def _reach(preds: tuple[np.ndarray, np.ndarray], finals: np.ndarray, calls: list[tuple[int, int]]) -> np.ndarray:
    """The states from which one of `finals` is reached over the byte edges and `calls` (back state, calling state)."""
    offsets, sources = preds
    through_calls: dict[int, list[int]] = {}
    for back, state in calls:
        through_calls.setdefault(back, []).append(state)
    seen = set(finals.tolist())
    pending = deque(seen)
    while pending:
        state = pending.popleft()
        for before in [*sources[offsets[state] : offsets[state + 1]].tolist(), *through_calls.get(state, ())]:
            if before not in seen:
                seen.add(before)
                pending.append(before)
    return np.fromiter(seen, dtype=np.int64, count=len(seen))
