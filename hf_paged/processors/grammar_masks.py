"""Token masks of a grammar automaton's states shared across contexts.

A state inside a rule (`grammar_dfa.GrammarDFA.inside`) walks tokens exactly as its rule state does in the rule's
own automaton until a token reaches one of the rule's calls or ends (its boundary); only beyond that do the
callers matter. So per rule state, on the rule's own table:

    under   boundary rows dead                  U: the tokens that never pass a boundary (allowed in every context)
    over    boundary rows lead to a sink that   O: U plus the tokens that pass one (allowed in some contexts)
            takes any byte

U is every context's answer when O = U, and its mask is shared by all of them (a `format: uri` value used by
twenty members: one trie walk, not twenty). Otherwise the few tokens of O - U are walked in this context's
automaton. The caller tries the automaton's own string-body plans (`TrieWalk.planned`, already cheap) first.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np

from hf_paged.processors.byte_dfa import ByteDFA
from hf_paged.processors.token_trie import TokenTrie
from hf_paged.processors.token_walk import TrieWalk

__all__ = ["GrammarMasks"]

MAX_CROSSING = 256  # tokens past a boundary walked per context; beyond this the automaton's own walk decides


class GrammarMasks:
    """Per rule state, the tokens allowed whatever the callers (`allowed`) and the shared masks built from them.

    Args:
        dfa: the grammar automaton (`GrammarDFA`).
        trie: the vocabulary trie.
        walk: the trie walk over `dfa` (its `next_state` checks tokens in one context).
        narrow_bytes: the walks' knob (`TrieWalk`).
    """

    def __init__(self, dfa, trie: TokenTrie, walk: TrieWalk, narrow_bytes: int):
        self.dfa = dfa
        self.trie = trie
        self.walk = walk
        self.narrow_bytes = narrow_bytes
        self._views: dict[int, tuple[TrieWalk, TrieWalk]] = {}
        self._shared: dict[tuple[int, int, bool], object] = {}  # (rule, rule state, final) -> mask, when O = U
        self._seen: dict[tuple[int, int], int] = {}  # (rule, rule state) -> contexts it was met in
        self._lock = threading.Lock()

    def mask(self, state: int, final: bool, build: Callable[[list[int] | np.ndarray, bool], object]) -> object | None:
        """The mask of `state` built by `build(allowed ids, final)` (shared across contexts when it can be), or
        None when the automaton's own walk should decide (not inside a rule, first met, narrow, many crossings)."""
        found = self.dfa.inside(state)
        if found is None:
            return None
        _, rule_index, rule_state = found
        rule = self.dfa.rules[rule_index]
        key = (rule_index, rule_state, final)
        shared = self._shared.get(key)
        if shared is not None:
            return shared
        # worth two walks of the rule's views only for a wide state met in a second context (a narrow one costs
        # tens of microseconds; a string body has its plan)
        seen = self._seen[rule_index, rule_state] = self._seen.get((rule_index, rule_state), 0) + 1
        if seen < 2 or rule.has_calls[rule_state] or rule.finals[rule_state] or self.walk.is_narrow(state):
            return None
        under, over = self._rule_views(rule_index)
        within = np.asarray(under.allowed(rule_state), dtype=np.int64)  # (unique ids: the walks' contract)
        reach = np.asarray(over.allowed(rule_state), dtype=np.int64)
        if reach.shape[0] == within.shape[0]:  # no token passes the boundary: the same in every context
            mask = build(within, final)
            with self._lock:
                self._shared[key] = mask
            return mask
        member = np.zeros(max(int(reach.max()), int(within.max(initial=0))) + 1, dtype=bool)
        member[within] = True
        crossing = reach[~member[reach]]
        if crossing.shape[0] > MAX_CROSSING:
            return None
        token_bytes = self.trie.token_bytes
        kept = [t for t in crossing.tolist() if self.walk.next_state(state, token_bytes[t]) is not None]
        return build(np.concatenate([within, np.asarray(kept, dtype=np.int64)]), final)

    def _rule_views(self, rule_index: int) -> tuple[TrieWalk, TrieWalk]:
        views = self._views.get(rule_index)
        if views is None:
            rule = self.dfa.rules[rule_index]
            table, dead = rule.table, rule.dead  # [S + 1, 256], dead = S
            boundary = rule.has_calls | rule.finals
            boundary[dead] = False
            under = table.copy()
            under[boundary] = dead
            over = np.empty((dead + 2, 256), dtype=np.int32)  # rows: the rule's states, the sink S, dead S + 1
            over[:dead] = np.where(table[:dead] == dead, dead + 1, table[:dead])
            over[:dead][boundary[:dead]] = dead  # (the sink's number is the rule's old dead)
            over[dead] = dead
            over[dead + 1] = dead + 1
            no_finals = np.zeros(dead + 1, dtype=bool)
            views = (
                TrieWalk(ByteDFA.from_arrays(under, rule.initial, no_finals), self.trie, self.narrow_bytes),
                TrieWalk(ByteDFA.from_arrays(over, rule.initial, np.zeros(dead + 2, dtype=bool)), self.trie,
                         self.narrow_bytes),
            )
            with self._lock:
                self._views.setdefault(rule_index, views)
        return self._views[rule_index]
