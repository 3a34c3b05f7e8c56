"""Subset construction: a byte NFA (`nfa.py`) -> a dense byte DFA, every state and step counted.

    byte classes   bytes no NFA range tells apart share a column (JSON regexes: ~30-90 classes, not 256)
    DFA state      (the NFA's byte-reading states after epsilon moves, whether MATCH was reached): numbered
                   breadth-first from the start, as regex-automata numbers them
    trim           states from which no text can reach a match become the dead state (a token walk then never
                   follows a byte into a dead end)

The budget's `dfa_states` and `dfa_steps` bound the work: a pattern whose automaton explodes (`[ab]*a[ab]{20}`
needs 2^21 states) raises `SchemaTooComplexError` after a fixed amount of work, whatever the machine's load.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from hf_paged.processors import jit
from hf_paged.processors.automaton.dfa_kernel import subset_construction
from hf_paged.processors.automaton.nfa import LOOK, NFA, SPARSE, SPLIT
from hf_paged.processors.budget import CompileBudget

__all__ = ["JIT_MIN_POSITIONS", "DenseDFA", "determinize"]

# NFAs from this size on start loading the compiled subset construction (`jit.start`); below, its Python twin
# takes milliseconds, less than loading numba (~0.7 s of CPU in the background)
JIT_MIN_POSITIONS = 5_000



@dataclass(slots=True)
class DenseDFA:
    """`transitions` int32 [S + 1, 256] (row S is the dead state, all S), `finals` bool [S + 1], initial state 0."""

    transitions: np.ndarray
    finals: np.ndarray


def determinize(nfa: NFA, budget: CompileBudget) -> DenseDFA | None:
    """The DFA of `nfa`, or None when it matches no text at all.

    Raises:
        SchemaTooComplexError: more states or steps than the budget allows.
    """
    kinds, edges = nfa.kinds, nfa.edges
    if len(kinds) >= JIT_MIN_POSITIONS:  # (a big automaton: worth the compiled loop from the next one on)
        jit.start()
    byte_class, _ = _byte_classes(nfa)
    classes = byte_class.tolist()
    spans: list[tuple[int, int, int]] = []
    sp_ptr = [0] * (len(kinds) + 1)
    eps: list[int] = []
    eps_ptr = [0] * (len(kinds) + 1)
    look = np.zeros((len(kinds), 2), dtype=np.int64)
    for state, kind in enumerate(kinds):
        if kind == SPARSE:
            own = edges[state]
            if len(own) == 1:
                lo, hi, nxt = own[0]
                spans.append((classes[lo], classes[hi], nxt))
            elif own:
                spans += sorted([(classes[lo], classes[hi], nxt) for lo, hi, nxt in own])
        elif kind == SPLIT:
            eps += edges[state]
        elif kind == LOOK:
            look[state] = edges[state]
        sp_ptr[state + 1] = len(spans)
        eps_ptr[state + 1] = len(eps)
    _, num_states, steps, finals, run_ptr, runs = subset_construction(  # (over a limit: the spends raise)
        np.asarray(kinds, dtype=np.int8), np.asarray(sp_ptr, dtype=np.int64),
        np.asarray(spans, dtype=np.int64).reshape(-1, 3), np.asarray(eps_ptr, dtype=np.int64),
        np.asarray(eps, dtype=np.int64), look, nfa.start, budget.left("dfa_states"), budget.left("dfa_steps"))
    budget.spend("dfa_states", num_states)
    budget.spend("dfa_steps", steps)
    if num_states == 0:
        return None
    run_state = np.repeat(np.arange(run_ptr.shape[0] - 1, dtype=np.int64), np.diff(run_ptr))
    return _trim(runs, run_state, finals, byte_class)


def _byte_classes(nfa: NFA) -> tuple[np.ndarray, int]:
    """int64 [256]: the class of each byte (bytes in the same class lead to the same NFA states everywhere)."""
    starts = np.zeros(257, dtype=bool)
    starts[0] = True
    for state, kind in enumerate(nfa.kinds):
        if kind == SPARSE:
            for lo, hi, _ in nfa.edges[state]:
                starts[lo] = True
                starts[hi + 1] = True
    byte_class = np.cumsum(starts[:256]) - 1
    return byte_class, int(byte_class[-1]) + 1


def _trim(runs: np.ndarray, run_state: np.ndarray, finals: np.ndarray, byte_class: np.ndarray) -> DenseDFA | None:
    """The dense table from the runs (first class, last class, next state; -1 dead) of each state, keeping the
    states that can reach a final one (in their order); the others become the dead state."""
    num_states = finals.shape[0]
    target = runs[:, 2]
    linked = target >= 0
    pairs = np.unique(target[linked] * num_states + run_state[linked])  # (to, from), each edge once, sorted by `to`
    preds = (pairs % num_states).tolist()
    starts = np.searchsorted(pairs // num_states, np.arange(num_states + 1)).tolist()
    live = finals.tolist()
    stack = [state for state, final in enumerate(live) if final]
    while stack:  # backwards from the finals (a Python walk: one step per edge, however long the chains)
        state = stack.pop()
        for before in preds[starts[state] : starts[state + 1]]:
            if not live[before]:
                live[before] = True
                stack.append(before)
    if not live[0]:
        return None
    kept = np.asarray(live, dtype=bool)
    renumber = np.full(num_states + 1, -1, dtype=np.int64)  # (index -1, a dead target, stays -1)
    renumber[:-1][kept] = np.arange(int(kept.sum()))
    dead = int(kept.sum())
    rows, nexts = renumber[run_state], renumber[target]
    use = (rows >= 0) & (nexts >= 0)
    # classes are contiguous byte ranges, in order: a run of classes is one run of bytes
    class_start = np.flatnonzero(np.diff(byte_class, prepend=-1))
    class_end = np.append(class_start[1:], 256) - 1
    first_byte, last_byte = class_start[runs[use, 0]], class_end[runs[use, 1]]
    lengths = last_byte - first_byte + 1
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    transitions = np.full((dead + 1, 256), dead, dtype=np.int32)
    transitions[np.repeat(rows[use], lengths), np.repeat(first_byte, lengths) + offsets] = np.repeat(nexts[use], lengths)
    return DenseDFA(transitions, np.append(finals[kept], False))
