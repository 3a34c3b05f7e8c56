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
from itertools import chain

import numpy as np

from hf_paged.processors import jit
from hf_paged.processors.automaton.dfa_kernel import subset_construction
from hf_paged.processors.automaton.layout_kernel import nfa_layout, trim_table
from hf_paged.processors.automaton.nfa import LOOK, NFA, SPARSE, SPLIT
from hf_paged.processors.budget import CompileBudget

__all__ = ["JIT_MIN_POSITIONS", "KERNEL_LIMIT", "DenseDFA", "FlatNFA", "Subsets", "determinize", "flat_nfa", "subsets"]

# NFAs from this size on start loading the compiled subset construction (`jit.start`); below, its Python twin
# takes milliseconds, less than loading numba (~0.7 s of CPU in the background)
JIT_MIN_POSITIONS = 5_000
KERNEL_LIMIT = 1 << 62  # limits passed to kernels are int64: a larger one (never reached) is passed as this


@dataclass(slots=True)
class DenseDFA:
    """`transitions` int32 [S + 1, 256] (row S is the dead state, all S), `finals` bool [S + 1], initial state 0."""

    transitions: np.ndarray
    finals: np.ndarray


def determinize(nfa: FlatNFA, budget: CompileBudget) -> DenseDFA | None:
    """The DFA of `nfa`, or None when it matches no text at all.

    Raises:
        SchemaTooComplexError: more states or steps than the budget allows.
    """
    found = subsets(nfa, budget)
    return None if found is None else found.dense()


@dataclass(slots=True)
class Subsets:
    """A subset construction's rows before the table is written: state s's runs are runs[run_ptr[s]:run_ptr[s + 1]],
    each (first class, last class, next state or -1 dead). Every state was reached from the initial one, and one of
    them is final (`subsets`): the initial state is live, so `dense` always has a table to give."""

    runs: np.ndarray
    run_ptr: np.ndarray
    finals: np.ndarray  # bool [states]
    byte_class: np.ndarray  # int64 [256]

    @property
    def num_states(self) -> int:
        return self.finals.shape[0]

    def dense(self) -> DenseDFA:
        """The trimmed dense table (`trim_table`: states that cannot reach a match become the dead one)."""
        initial_live, transitions, kept_finals = trim_table(self.runs, self.run_ptr, self.finals, self.byte_class)
        assert initial_live, "a state of the subset construction is final: the initial state reaches it"
        return DenseDFA(transitions, kept_finals)


def subsets(nfa: FlatNFA, budget: CompileBudget) -> Subsets | None:
    """The subset construction of `nfa` (every state and step counted, as `determinize` counts them), its table not
    written yet; None when it matches no text (no state is final: every state is reached from the initial one, so
    the initial one is live exactly when one is).

    Raises:
        SchemaTooComplexError: more states or steps than the budget allows.
    """
    if nfa.kinds.shape[0] >= JIT_MIN_POSITIONS:  # (a big automaton: worth the compiled loop from the next one on)
        jit.start()
    sp_ptr, spans, eps_ptr, byte_class = nfa_layout(nfa.kinds, nfa.sparse, nfa.counts, nfa.flat, nfa.split,
                                                    nfa.eps_counts)
    _, num_states, steps, finals, run_ptr, runs = subset_construction(  # (over a limit: the spends raise)
        nfa.kinds, sp_ptr, spans, eps_ptr, nfa.eps, nfa.look, nfa.start, min(budget.left("dfa_states"), KERNEL_LIMIT),
        min(budget.left("dfa_steps"), KERNEL_LIMIT))
    budget.spend("dfa_states", num_states)
    budget.spend("dfa_steps", steps)
    if num_states == 0 or not finals.any():
        return None
    return Subsets(runs, run_ptr, finals, byte_class)


@dataclass(slots=True)
class FlatNFA:
    """An NFA (`nfa.py`'s states) as flat arrays, each state's edges in its own order, states in order."""

    kinds: np.ndarray  # int8 [n]
    sparse: np.ndarray  # int64: the byte-reading states
    counts: np.ndarray  # int64: their number of byte ranges
    flat: np.ndarray  # int64 [E, 3]: (first byte, last byte, next) of each, state after state
    split: np.ndarray  # int64: the split states
    eps_counts: np.ndarray  # int64: their number of targets
    eps: np.ndarray  # int64: the targets, state after state
    look: np.ndarray  # int64 [n, 2]: (anchor, next) of look states (zeros elsewhere)
    start: int


def flat_nfa(nfa: NFA) -> FlatNFA:
    """`nfa`'s edge lists as flat arrays, at C speed (`chain`, `map`)."""
    kinds_list, edges = nfa.kinds, nfa.edges
    kinds = np.asarray(kinds_list, dtype=np.int8)
    sparse = np.flatnonzero(kinds == SPARSE)
    sparse_edges = [edges[q] for q in sparse.tolist()]
    counts = np.fromiter(map(len, sparse_edges), dtype=np.int64, count=len(sparse_edges))
    flat = np.fromiter(chain.from_iterable(chain.from_iterable(sparse_edges)), dtype=np.int64,
                       count=3 * int(counts.sum())).reshape(-1, 3)
    split = np.flatnonzero(kinds == SPLIT)
    split_edges = [edges[q] for q in split.tolist()]
    eps_counts = np.fromiter(map(len, split_edges), dtype=np.int64, count=len(split_edges))
    eps = np.fromiter(chain.from_iterable(split_edges), dtype=np.int64, count=int(eps_counts.sum()))
    look = np.zeros((len(kinds_list), 2), dtype=np.int64)
    looks = np.flatnonzero(kinds == LOOK)
    if looks.shape[0]:
        look[looks] = np.array([edges[q] for q in looks.tolist()], dtype=np.int64)
    return FlatNFA(kinds, sparse, counts, flat, split, eps_counts, eps, look, nfa.start)
