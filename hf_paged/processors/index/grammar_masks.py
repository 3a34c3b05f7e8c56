"""Token masks of a grammar automaton's wide states inside rules, from walks shared across counts and contexts.

A state inside a rule (`grammar_dfa.GrammarDFA.inside`) walks tokens exactly as its rule state does in the rule's
own table until a token reaches one of the rule's stops (a call, a finished callee); only beyond a stop do the
callers matter. And a counted pattern (`maxLength`, `{0,29}` words) names a new rule state at nearly every token,
though a token is a few bytes long. So per rule and lookahead class (`state_classes.lookahead_classes`: rule states no
string of <= LOOKAHEAD bytes tells apart), one walk of the rule's table from the first state met gives:

    within    the tokens of <= LOOKAHEAD bytes that stay inside the rule: allowed in every state of the class,
              in every context (kept as a one-row plan, `string_masks.BodyPlan`: its words are copied, not set
              again id by id, on every state of the class)
    stops     the (trie node, stop state) pairs met at depth <= LOOKAHEAD: the same for the whole class

and a state's mask is `within`'s words, plus the bits of the stops walked on in its own context
(`TrieWalk.continue_pairs`: the closing quote and what follows it) and of the few tokens longer than LOOKAHEAD
walked one by one from the state itself (72 with GPT-2): no walk of the vocabulary trie. A class's first state
takes its string-body plan instead when it has one (cheaper than a walk, and most classes are met once); the
classes of a rule are computed ahead of decoding, off the caller's path (`prepare`, after the index is published:
~3 ms per 1000 rule states, a quarter of a real-world schema's compile when it ran inside it), or, when decoding
meets a rule's wide states a second time before that, then.

Measured on MaskBench's Github_hard---o21072 (word-count patterns under `maxLength`: a new rule state per token):
its first visits over 500 us went from 85 to 32 of 261 tokens.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hf_paged.processors.index.state_classes import LOOKAHEAD, lookahead_classes
from hf_paged.processors.index.string_masks import BodyPlan, PlannedIds, set_bits
from hf_paged.processors.index.token_trie import TokenTrie
from hf_paged.processors.index.token_walk import TrieWalk
from hf_paged.processors.index.walk_kernel import pack_tokens, walk_pairs, walk_tokens

__all__ = ["GrammarMasks"]

MAX_WALK_BYTES = 16 << 20  # class walks kept per index (`within`: 6 KB of words + 4 bytes a token, <= 200 KB)


@dataclass(slots=True)
class _ClassWalk:
    """What one walk of a rule's table decides for every state of a lookahead class."""

    within: BodyPlan  # one row: the tokens of <= LOOKAHEAD bytes that stay inside the rule (int32 ids, words)
    stop_nodes: np.ndarray  # int64 trie nodes (depth <= LOOKAHEAD) where a token reaches a stop...
    stop_states: np.ndarray  # int64 ... and the stop's rule state


@dataclass(slots=True)
class _LongTokens:
    """The vocabulary's tokens longer than LOOKAHEAD bytes, laid out for `walk_tokens`."""

    ids: np.ndarray  # int64
    raw: list[bytes]
    flat: np.ndarray  # uint8: their bytes, one after the other
    offsets: np.ndarray  # int64 [n + 1]


class GrammarMasks:
    """Masks of wide states inside rules, shared per (rule, stops, lookahead class).

    Args:
        dfa: the grammar automaton (`GrammarDFA`).
        trie: the vocabulary trie.
        walk: the trie walk over `dfa` (its `continue_pairs` and `stops` finish a state in its context).
    """

    def __init__(self, dfa, trie: TokenTrie, walk: TrieWalk):
        self.dfa = dfa
        self.trie = trie
        self.walk = walk
        self._classes: dict[tuple[int, bool], np.ndarray] = {}  # (rule, called) -> class per rule state
        self._walks: OrderedDict[tuple[int, bool, int], _ClassWalk] = OrderedDict()
        self._walk_bytes = 0
        self._seen: dict[tuple[int, bool, int], int] = {}  # wide states met per class
        self._rule_seen: dict[tuple[int, bool], int] = {}  # wide states met per rule before its classes exist
        self._long = _long_tokens(trie)
        self._lock = threading.Lock()

    def prepare(self) -> None:
        """The lookahead classes and closed key states (`closed_states`) of every rule with a wide state (the root
        uncalled, the others called), ahead of decoding's visits: run off the caller's path (`TokenIndex.prepare`,
        after the index is published), beside decoding; every fact is memoised by value, so whichever thread
        computes one first, the other finds or recomputes the same."""
        for rule_index in range(len(self.dfa.rules)):
            if not self.walk.rule_narrow(rule_index).all():
                called = rule_index > 0
                inside = self.dfa.inside_mask(rule_index, called)
                self.classes(rule_index, called, inside)
                self.walk.closed_of(rule_index, called, inside)

    def mask(self, state: int, final: bool, build: Callable[[object, bool], object],
             planned: Callable[[int], object | None]) -> object | None:
        """The mask of a wide state inside a rule, built by `build(found, final)` (`found`: a `PlannedIds`); None
        for any other state (the automaton's own walk decides).

        A class's first state takes `planned(state)` (a string body's plan: cheap, but per state) when there is
        one; from its second on (the counted states that keep meeting the class) the class's shared walk. The
        classes themselves wait for a rule's second wide state with no plan of its own (most rules of a schema are
        met once, or never: their classes, ~3 ms per 1000 rule states, would be work for nothing at compile time).
        """
        view = self.dfa.inside_view(state)
        if view is None or self.walk.is_narrow(state):
            return None
        base, rule_index, called, rule_state, inside = view.base, view.rule, view.called, view.rule_state, view.inside
        if (rule_index, called) not in self._classes:
            met = self._rule_seen[rule_index, called] = self._rule_seen.get((rule_index, called), 0) + 1
            if met < 2:
                found = planned(state)
                if found is not None:
                    return build(found, final)
        classes = self.classes(rule_index, called, inside)
        key = (rule_index, called, int(classes[rule_state]))
        shared = self._walks.get(key)
        if shared is None:
            met = self._seen[key] = self._seen.get(key, 0) + 1
            if met < 2:
                found = planned(state)
                if found is not None:
                    return build(found, final)
            shared = self._class_walk(key, rule_state, inside)
        rule = self.dfa.rules[rule_index]
        parts = []
        if shared.stop_nodes.shape[0]:
            parts.append(self.walk.continue_pairs(shared.stop_nodes, shared.stop_states + base))
        long = self._long
        if long.ids.shape[0]:
            walked = walk_tokens(rule_state, rule.table, inside, rule.dead, long.flat, long.offsets)
            outcome, depth, stopped = walked.outcome, walked.stop_depth, walked.stop_state
            parts.append(long.ids[outcome == 1])
            for i in np.flatnonzero((outcome == 2) & (depth > LOOKAHEAD)).tolist():  # stops past the classes' reach
                if self.walk.stops.alive(base + int(stopped[i]), long.raw[i][int(depth[i]):]):
                    parts.append(long.ids[i : i + 1])
        extra = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
        return build(PlannedIds(shared.within, 0, extra), final)

    def classes(self, rule_index: int, called: bool, inside: np.ndarray) -> np.ndarray:
        """The lookahead classes of a rule's states (`inside`: not a stop), memoised."""
        found = self._classes.get((rule_index, called))
        if found is not None:
            return found
        rule = self.dfa.rules[rule_index]
        stops = ~inside
        stops[rule.dead] = False
        classes = lookahead_classes(rule.table, rule.dead, stops)
        with self._lock:
            self._classes[rule_index, called] = classes
        return classes

    def _class_walk(self, key: tuple[int, bool, int], rule_state: int, inside: np.ndarray) -> _ClassWalk:
        """One walk of the rule's table from `rule_state`, kept for its lookahead class `key`."""
        rule_index = key[0]
        rule, trie = self.dfa.rules[rule_index], self.trie
        root = np.zeros(1, dtype=np.int64)
        walked = walk_pairs(
            trie, root, np.array([rule_state], dtype=np.int64), rule.table, inside, rule.dead, rule.loops,
            rule.has_loops,
        )
        positions, nodes, states = walked.positions, walked.pending_nodes, walked.pending_states
        positions = positions[trie.pos_len[positions] <= LOOKAHEAD]
        shallow = trie.node_depth[nodes] <= LOOKAHEAD  # (deeper stops hold long tokens only: walked per state)
        ids = trie.pos_ids[positions].astype(np.int32)
        words = np.zeros((1, (len(trie.token_bytes) + 31) // 32), dtype=np.int32)
        set_bits(words[0], ids)
        found = _ClassWalk(BodyPlan(ids, np.array([ids.shape[0]], dtype=np.int64), words), nodes[shallow],
                           states[shallow])
        with self._lock:
            if key not in self._walks:
                self._walks[key] = found
                self._walk_bytes += _num_bytes(found)
            while self._walk_bytes > MAX_WALK_BYTES and len(self._walks) > 1:  # oldest first
                self._walk_bytes -= _num_bytes(self._walks.popitem(last=False)[1])
        return found


def _num_bytes(walk: _ClassWalk) -> int:
    return walk.within.ids.nbytes + walk.within.words.nbytes


def _long_tokens(trie: TokenTrie) -> _LongTokens:
    """The tokens of `trie` longer than LOOKAHEAD bytes (memoised on the trie)."""
    found = trie.long_tokens
    if found is None:
        positions = np.flatnonzero(trie.pos_len > LOOKAHEAD)
        raw = [trie.pos_bytes[p] for p in positions.tolist()]
        flat, offsets = pack_tokens(raw)
        found = trie.long_tokens = _LongTokens(trie.pos_ids[positions], raw, flat, offsets)
    return found
