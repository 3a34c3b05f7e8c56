"""Which tokens of a vocabulary trie keep one byte-automaton state alive: the walk behind `TokenIndex`'s masks.

Over the (node, DFA state) pairs still alive, the compiled depth-first walk (`walk_kernel`, ~10 ns a node):

    narrow state (<= NARROW_BYTES live bytes: keys, punctuation, numbers)
        one compiled call from the root that also sets the mask's bits (`narrow_marked`, a few microseconds); a
        grammar state inside a rule walks its rule's own table, the tokens reaching a call or a finished callee
        are followed on from there (`past_stops`, `past_stops`). The Python walk, node by node along the live
        bytes, is left for a grammar's states at a call or a finished callee (it builds the rows it reads)
    wide state (a string body, a free-form key)
        the compiled walk of the whole trie below the state, unless a plan decides it (below)

Shortcut: when every byte below a node loops on the node's state (`T[s, b] == s`, a string body), every token of
the subtree is allowed: its contiguous DFS slice is taken without descending.

Before any of that, a wide state with a string body, or a free-form key's prefix, is decided from a
per-vocabulary plan (`planned_walk.PlannedWalk`, this class's base: `decide` then returns a `PlannedIds`).
"""

from __future__ import annotations

from array import array

import numpy as np

from hf_paged.processors.automaton.byte_dfa import ByteDFA
from hf_paged.processors.automaton.grammar_string_steps import GrammarBodySteps
from hf_paged.processors.automaton.string_steps import BodySteps
from hf_paged.processors.index.past_stops import MANY_STOPS, GrammarStops
from hf_paged.processors.index.planned_walk import PlannedWalk
from hf_paged.processors.index.string_masks import PlannedIds, set_bits
from hf_paged.processors.index.token_trie import TokenTrie, ranges_to_ids
from hf_paged.processors.index.walk_kernel import walk_marked, walk_pairs

__all__ = ["TrieWalk"]

PYTHON_IDS = 256  # the Python walk hands back a list when it found at most this many tokens
NARROW_BYTES = 16  # a state with at most this many live bytes is narrow (a walk of a few subtrees)
PYTHON_LOOKUPS = 256  # the Python walk takes at most this many child lookups; what is left goes to the compiled walk


class _Sparse(dict):
    """A dict read like the per-state lists: a state not seen yet gives None."""

    def __missing__(self, key: int) -> None:
        return None


class TrieWalk(PlannedWalk):
    """Per-state Python views of a `ByteDFA` (filled on first use: a big automaton has thousands of states, most
    never seen) and the trie walk over them; the plan shortcuts come from `PlannedWalk`.

    Args:
        dfa: the byte automaton.
        trie: the vocabulary trie.
        narrow_bytes: states with at most this many live bytes are narrow (`narrow_marked`).
    """

    def __init__(self, dfa: ByteDFA, trie: TokenTrie, narrow_bytes: int = NARROW_BYTES):
        self.dfa = dfa
        self.trie = trie
        self.narrow_bytes = narrow_bytes
        self._dead = dfa.dead
        # for the compiled walk: every row of an automaton built at once can be read; which states have loops
        self._known = None if dfa.lazy else np.ones(dfa.transitions.shape[0], dtype=bool)
        self._has_loops = dfa.has_loops if dfa.lazy else dfa.loops.any(axis=1)
        self._ensure = dfa.ensure if dfa.lazy else None
        # per-state Python views as objects that hold no other objects (`array`, `bytes`, big ints): lists of ints
        # here made every young-generation collection visit 256 scattered ints per state seen (measured: 1-16 ms
        # pauses landing on random first visits)
        # (a grammar automaton has room for a million states and names few: sparse views, read the same way)
        size = dfa.num_states + 1
        self._rows: list[array | None] | _Sparse = _Sparse() if dfa.lazy else [None] * size  # next state per byte
        self._leaving: list[int | None] | _Sparse = _Sparse() if dfa.lazy else [None] * size  # bytes that move it
        self._live: list[bytes | None] | _Sparse = _Sparse() if dfa.lazy else [None] * size  # its live bytes
        self.use_bodies = True  # the `string_tokens` path for string bodies (off: trie walk only, for tests)
        self.compiled_narrow = True  # narrow states by the compiled walk (off: the Python walk, for tests)
        self._body: BodySteps | GrammarBodySteps = BodySteps(dfa.transitions, self._dead)
        if dfa.lazy:  # a grammar: inside states from their rules' own facts, the others on rows built on demand
            fallback = BodySteps(dfa.transitions, self._dead, self._ensure, dfa.ensure_path, dfa.multibyte_ends)
            self._body = GrammarBodySteps(dfa, fallback)
        self._closed: dict[tuple[int, bool], np.ndarray] = {}  # (rule, called) -> `closed_states` per rule state
        self._all_inside: np.ndarray | None = None  # an automaton built at once: no stops (`walk_tokens`)
        self._rule_narrow: dict[int, np.ndarray] = {}  # grammar rule -> `rule_narrow`
        self.stops = GrammarStops(dfa) if dfa.lazy else None  # tokens past a rule's stop, on call stacks

    def next_state(self, state: int, raw: bytes) -> int | None:
        """The state after the bytes `raw`, or None when they reach the dead state (a few list reads a byte)."""
        rows, dead = self._rows, self._dead
        for byte in raw:
            state = (rows[state] or self._row(state))[byte]
            if state == dead:
                return None
        return state

    def _row(self, state: int) -> array:
        self.dfa.ensure_one(state)
        row = self._rows[state] = array("i", self.dfa.transitions[state].astype(np.int32, copy=False).tobytes())
        return row

    def _leaving_set(self, state: int) -> int:
        leaving = self._leaving[state]
        if leaving is None:
            self.dfa.ensure_one(state)
            loops = int.from_bytes(self.dfa.loops[state].tobytes(), "little")
            leaving = self._leaving[state] = ((1 << 256) - 1) ^ loops
        return leaving

    def allowed(self, state: int) -> list[int] | np.ndarray:
        """The allowed regular ids of `state`: a list when the Python walk found few, else an int64 array."""
        found = self.decide(state)
        return found.ids() if isinstance(found, PlannedIds) else found

    def continue_pairs(self, nodes: np.ndarray, states: np.ndarray) -> np.ndarray:
        """Ids of the allowed tokens below (trie node, stop state) pairs (the node's own tokens included)."""
        return self.trie.pos_ids[self.past_stops(nodes, states)]

    def decide(self, state: int, planned: bool = True) -> list[int] | np.ndarray | PlannedIds:
        """The allowed regular ids of `state`, in the cheapest form to turn into a mask: a list when the Python walk
        found few, a `PlannedIds` for a string body (a row of a per-vocabulary plan plus a few extra ids), else an
        int64 array.

        Narrow states (at most `NARROW_BYTES` live bytes: keys, punctuation, numbers) take `narrow_marked` (the
        Python walk, node by node along their live bytes, when it does not apply or `compiled_narrow` is off);
        wide pairs met on the way go to the compiled walk. `planned=False`: the caller tried `planned` already.
        """
        trie = self.trie
        if planned:
            found = self.planned(state)
            if found is not None:
                return found
        if self.compiled_narrow and self.is_narrow(state):
            found = self.narrow_marked(state, np.zeros(trie.first_words.shape[1], dtype=np.uint32))
            if found is not None:
                return found.tolist() if found.shape[0] <= PYTHON_IDS else found
        pos_start, pos_end, sub_set, child_of = trie.pos_start, trie.pos_end, trie.sub_set, trie.child_of
        ranges: list[tuple[int, int]] = []  # DFS position ranges of allowed tokens
        wide_nodes: list[int] = []
        wide_states: list[int] = []
        stack = [(0, state)]
        budget = PYTHON_LOOKUPS
        while stack:
            if budget < 0:  # a wide subtree after all (e.g. every token made of digits): compiled walk from here on
                wide_nodes.extend(node for node, _ in stack)
                wide_states.extend(current for _, current in stack)
                break
            node, current = stack.pop()
            start = pos_start[node]
            if not sub_set[node] & self._leaving_set(current):  # every byte below loops here: all allowed
                ranges.append((start, pos_end[node]))
                continue
            live = self._live_bytes(current)
            if len(live) > self.narrow_bytes:
                wide_nodes.append(node)
                wide_states.append(current)
                continue
            if pos_start[node + 1] > start:
                ranges.append((start, pos_start[node + 1]))
            base = node << 8
            budget -= len(live)
            row = self._rows[current] or self._row(current)
            for byte in live:
                child = child_of.get(base | byte)
                if child is not None:
                    stack.append((child, row[byte]))
        if not wide_nodes and sum(end - start for start, end in ranges) <= PYTHON_IDS:
            pos_id_list = trie.pos_id_list
            return [pos_id_list[p] for start, end in ranges for p in range(start, end)]
        ids = ranges_to_ids(
            self.trie, np.array([r[0] for r in ranges], dtype=np.int64), np.array([r[1] for r in ranges], dtype=np.int64)
        )
        if wide_nodes:
            kept = self._wide_walk(np.array(wide_nodes, dtype=np.int64), np.array(wide_states, dtype=np.int64))
            return np.concatenate([ids, trie.pos_ids[kept]])
        return ids

    def narrow_marked(self, state: int, words: np.ndarray) -> np.ndarray | None:
        """A narrow state's allowed ids (int64, unordered), their bits set in `words` (uint32) by the same compiled
        call that walks the trie (`walk_marked`, ~5 us where the Python walk reads a few new states' rows at ~5 us
        each): on the automaton's table, or for a grammar state inside a rule on its rule's table, the pairs at a
        stop followed on with `past_stops`. None for a grammar state at a call or a finished callee (the Python
        walk builds the rows it needs), or when the compiled narrow walk is off."""
        if not self.compiled_narrow:
            return None
        trie, dfa = self.trie, self.dfa
        if not dfa.lazy:
            walked = walk_marked(trie, state, dfa.transitions, self._known, self._dead, dfa.loops, self._has_loops,
                                 words)
            return walked.positions
        view = dfa.inside_view(state)
        if view is None:
            return None
        rule = dfa.rules[view.rule]
        walked = walk_marked(trie, view.rule_state, rule.table, view.inside, rule.dead, rule.loops, rule.has_loops,
                             words)
        if not walked.pending_nodes.shape[0]:
            return walked.positions
        more = trie.pos_ids[self.past_stops(walked.pending_nodes, walked.pending_states + view.base)]
        set_bits(words.view(np.int32), more)
        return np.concatenate([walked.positions, more])

    def past_stops(self, nodes: np.ndarray, states: np.ndarray) -> np.ndarray:
        """DFS positions of the allowed tokens below (trie node, stop state) pairs: the node's bytes took a walk to a
        call or a finished callee. A few tokens: each on its own stacks (`past_stops`); more: the automaton."""
        trie = self.trie
        starts, ends = trie.pos_ptr[nodes], trie.sub_end[nodes]
        if int((ends - starts).sum()) > MANY_STOPS:
            return self._wide_walk(nodes, states)
        kept = []
        for node, state, start, end in zip(nodes.tolist(), states.tolist(), starts.tolist(), ends.tolist()):
            depth = int(trie.node_depth[node])
            for position in range(start, end):
                if self.stops.alive(state, trie.pos_bytes[position][depth:]):
                    kept.append(position)
        return np.array(kept, dtype=np.int64)

    def prepare(self) -> None:
        """Per-automaton facts the string-body path needs (`BodySteps.prepare`), ahead of the first visit."""
        self._body.prepare()

    def is_narrow(self, state: int) -> bool:
        """True when `state` has at most `narrow_bytes` live bytes (keys, punctuation, numbers: a walk of a few
        subtrees); a grammar state inside a rule reads its rule's counts (no row of its own needed)."""
        live = self._live[state]
        if live is None and self.dfa.lazy:
            view = self.dfa.inside_view(state)
            if view is not None:
                return bool(self.rule_narrow(view.rule)[view.rule_state])
        return len(live if live is not None else self._live_bytes(state)) <= self.narrow_bytes

    def rule_narrow(self, rule_index: int) -> np.ndarray:
        """bool per state of a grammar rule: at most `narrow_bytes` live bytes (memoised)."""
        narrow = self._rule_narrow.get(rule_index)
        if narrow is None:
            rule = self.dfa.rules[rule_index]
            live = np.count_nonzero(rule.table != rule.dead, axis=1)
            narrow = self._rule_narrow[rule_index] = live <= self.narrow_bytes
        return narrow

    def _live_bytes(self, state: int) -> bytes:
        """The bytes that do not kill `state` (their next states: `_row`)."""
        live = self._live[state]
        if live is None:
            self.dfa.ensure_one(state)
            live = self._live[state] = (
                np.flatnonzero(self.dfa.transitions[state] != self._dead).astype(np.uint8).tobytes()
            )
        return live

    def _wide_walk(self, nodes: np.ndarray, states: np.ndarray) -> np.ndarray:
        """DFS positions of the allowed tokens below wide (node, state) pairs, by the compiled walk (`walk_kernel`).

        A grammar automaton builds rows on demand: pairs inside a rule are walked on the rule's own table (every
        row there), back in the automaton at calls and finished callees; the automaton's pairs whose rows are
        not built yet come back from the walk, get their rows (`ensure`, one gather per context) and go again.
        """
        trie, dfa = self.trie, self.dfa
        if not dfa.lazy:
            return walk_pairs(
                trie, nodes, states, dfa.transitions, self._known, self._dead, dfa.loops, self._has_loops
            ).positions
        found: list[np.ndarray] = []
        while nodes.shape[0]:
            contexts = dfa._state_context[states]
            rest = np.ones(nodes.shape[0], dtype=bool)
            more_nodes, more_states = [], []
            for context in np.unique(contexts[contexts > 0]).tolist():
                view = dfa.context_view(context)
                base, rule, inside = view.base, dfa.rules[view.rule], view.inside
                which = np.flatnonzero(contexts == context)
                rule_states = dfa._rule_state[states[which]].astype(np.int64)
                keep = inside[rule_states]
                if keep.any():
                    rest[which[keep]] = False
                    walked = walk_pairs(
                        trie, nodes[which[keep]], rule_states[keep], rule.table, inside, rule.dead, rule.loops,
                        rule.has_loops,
                    )
                    found.append(walked.positions)
                    more_nodes.append(walked.pending_nodes)
                    more_states.append(walked.pending_states + base)
            nodes = np.concatenate([nodes[rest], *more_nodes])
            states = np.concatenate([states[rest], *more_states])
            if not nodes.shape[0]:
                break
            self._ensure(states)
            walked = walk_pairs(
                trie, nodes, states, dfa.transitions, dfa.known, self._dead, dfa.loops, dfa.has_loops
            )
            found.append(walked.positions)
            nodes, states = walked.pending_nodes, walked.pending_states
        return np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
