"""The plan shortcuts of a trie walk (`PlannedWalk`, a part of `token_walk.TrieWalk`): wide states decided from
per-vocabulary string-body plans instead of a walk of the whole trie.

A wide state with a string body (`string_steps`: plain or counted, `[^"]{0,n}` included) is decided from the
vocabulary's body split (`string_tokens`) and its plan (`string_masks`): a row of per-vocabulary bitmask words plus
an exact walk of the few hundred tokens holding a quote, a backslash, a control byte or malformed UTF-8
(`_others_alive`; the answer is a `PlannedIds`). So is a grammar state from which every string of key characters
stays alive (`closed_states`: the prefixes of a free-form key, whatever names they may still spell), with the plan
of all key-body tokens. A state whose biggest group of bytes leads into a body (the first character of a free-form
key) is decided the same way on the bytes past the first, and walks the trie only below the other first bytes.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING, Any

import numpy as np

from hf_paged.processors.automaton.grammar_string_steps import GrammarBodySteps
from hf_paged.processors.automaton.string_steps import UNBOUNDED, BodySteps
from hf_paged.processors.index.closed_states import closed_states
from hf_paged.processors.index.past_stops import MANY_STOPS, GrammarStops
from hf_paged.processors.index.string_masks import PlannedIds, body_plan, group_words
from hf_paged.processors.index.string_tokens import JSON_KEY_ASCII, BodyTokens, body_tokens
from hf_paged.processors.index.token_trie import TokenTrie
from hf_paged.processors.index.walk_kernel import walk_tokens

__all__ = ["PlannedWalk"]


class PlannedWalk:
    """The string-body and free-form-key plans of a `TrieWalk` (its base class: the walk's state and its trie walks
    are the `TrieWalk`'s, declared below)."""

    # the walk's state (`TrieWalk.__init__`)
    dfa: Any
    trie: TokenTrie
    narrow_bytes: int
    use_bodies: bool  # off: no plans (trie walk only, for tests)
    stops: GrammarStops | None
    _dead: int
    _body: BodySteps | GrammarBodySteps
    _closed: dict[tuple[int, bool], np.ndarray]
    _all_inside: np.ndarray | None
    _rows: Any  # per-state rows (`TrieWalk._row`)

    if TYPE_CHECKING:  # the walks a plan falls back on (`TrieWalk`)
        def _row(self, state: int) -> array: ...
        def _live_bytes(self, state: int) -> bytes: ...
        def is_narrow(self, state: int) -> bool: ...
        def _wide_walk(self, nodes: np.ndarray, states: np.ndarray) -> np.ndarray: ...

    def planned(self, state: int) -> PlannedIds | None:
        """A wide state's allowed ids from a string-body plan (`_body_planned`, `_first_byte_planned`), or None."""
        if len(self._live_bytes(state)) <= self.narrow_bytes:
            return None
        return self._body_planned(state) or self._first_byte_planned(state)

    def body_planned(self, state: int) -> PlannedIds | None:
        """A wide state's allowed ids from its own string body's plan (`_body_planned`), or None."""
        if len(self._live_bytes(state)) <= self.narrow_bytes:
            return None
        return self._body_planned(state)

    def first_byte_planned(self, state: int) -> PlannedIds | None:
        """A wide state's allowed ids from the plan of the body its first bytes lead into (`_first_byte_planned`),
        or None (`planned` without trying the state's own body again)."""
        if len(self._live_bytes(state)) <= self.narrow_bytes:
            return None
        return self._first_byte_planned(state)

    def closed_planned(self, state: int) -> PlannedIds | None:
        """The allowed ids of a grammar state inside a rule from which every string of key characters stays alive
        and inside (`closed_states`: a free-form key's prefixes), or None: the plan row of every key-body token, plus
        the tokens holding another byte (a quote, a backslash, non-ASCII: ~1k with GPT-2) walked one by one
        (`_others_alive`)."""
        if not self.use_bodies or not self.dfa.lazy or self.is_narrow(state):
            return None
        view = self.dfa.inside_view(state)
        if view is None:
            return None
        if not self.closed_of(view.rule, view.called, view.inside)[view.rule_state]:
            return None
        split = body_tokens(self.trie, JSON_KEY_ASCII, False)
        if not split.complete:
            return None
        plan = body_plan(self.trie, split)
        return PlannedIds(plan, plan.row(UNBOUNDED), self.trie.pos_ids[self._others_alive(split, state)])

    def closed_of(self, rule_index: int, called: bool, inside: np.ndarray) -> np.ndarray:
        """`closed_states` of a grammar rule's states for the key body (`inside`: not a stop), memoised."""
        closed = self._closed.get((rule_index, called))
        if closed is None:
            rule = self.dfa.rules[rule_index]
            closed = self._closed[rule_index, called] = closed_states(rule.table, inside, rule.dead, JSON_KEY_ASCII)
        return closed

    def _others_alive(self, split: BodyTokens, state: int, keep: np.ndarray | None = None) -> np.ndarray:
        """Positions of `split`'s other tokens (those where `keep`, if given) whose bytes keep `state` alive, each
        walked on its own by the compiled loop (`walk_tokens`): on the automaton's table when every row is built,
        else (a grammar) on the state's rule's table, on from a stop with `past_stops`."""
        if not self.dfa.lazy:
            if self._all_inside is None:
                self._all_inside = np.ones(self.dfa.transitions.shape[0], dtype=bool)
            table, inside, dead, start, base = self.dfa.transitions, self._all_inside, self._dead, state, 0
        else:
            view = self.dfa.inside_view(state)
            if view is None:  # a call or a finished callee itself (rare): on the automaton's rows
                which = np.arange(split.other_positions.shape[0]) if keep is None else np.flatnonzero(keep)
                raws = [self.trie.pos_bytes[p] for p in split.other_positions[which].tolist()]
                return split.other_positions[which[self.stops.rests_alive(np.full(which.shape[0], state), raws)]]
            rule = self.dfa.rules[view.rule]
            table, inside, dead, start, base = rule.table, view.inside, rule.dead, view.rule_state, view.base
        walked = walk_tokens(start, table, inside, dead, split.other_flat, split.other_offsets)
        alive = walked.outcome == 1
        stopped = walked.outcome == 2
        if keep is not None:
            alive &= keep
            stopped &= keep
        positions, pos_bytes = split.other_positions, self.trie.pos_bytes
        which = np.flatnonzero(stopped)
        rests = [pos_bytes[p][d:] for p, d in zip(positions[which].tolist(), walked.stop_depth[which].tolist())]
        stops = walked.stop_state[which] + base
        if which.shape[0] > MANY_STOPS:  # (a string closing its rule: ~100 tokens) on the automaton's rows
            alive[which] = self.stops.rests_alive(stops, rests)
        else:  # a few at a call or a finished callee: on in their stacks, no state named
            alive[which] = [self.stops.alive(stop, rest) for stop, rest in zip(stops.tolist(), rests)]
        return positions[alive]

    def _body_allowed(self, state: int) -> np.ndarray | None:
        """The allowed ids of a state decided from the vocabulary's body split (its own body, else on its first
        byte), or None."""
        planned = self._body_planned(state) or self._first_byte_planned(state)
        return None if planned is None else planned.ids()

    def _body_planned(self, state: int) -> PlannedIds | None:
        """The allowed ids of a state with a string body, from the vocabulary's body split (`string_tokens`) and its
        plan (`string_masks`); None when its body does not decide them."""
        if not self.use_bodies:
            return None
        body = self._body
        steps = body.steps_of(state)
        if steps < 1:
            return None
        ascii_bits, _, multibyte = body.body_of(state)
        if not self._bans_longer(state, steps, ascii_bits, multibyte):
            return None
        split = body_tokens(self.trie, ascii_bits, multibyte)
        if not split.complete:
            return None
        plan = body_plan(self.trie, split)
        kept = self._others_alive(split, state)
        return PlannedIds(plan, plan.row(steps), self.trie.pos_ids[kept])

    def _first_byte_allowed(self, state: int) -> np.ndarray | None:
        """The allowed ids of a state decided on its first byte (`_first_byte_planned`), or None."""
        planned = self._first_byte_planned(state)
        return None if planned is None else planned.ids()

    def _first_byte_planned(self, state: int) -> PlannedIds | None:
        """Tokens whose first byte is in the state's biggest ASCII group G (all lead to one state t with a body):
        their bytes past the first from t's `skip_first` body split and its plan, restricted to G; the others
        (first byte outside G) by the trie walk."""
        if not self.use_bodies:
            return None
        body, trie = self._body, self.trie
        group_bits, target, _ = body.body_of(state)
        if not group_bits or target == self._dead or target == state:
            return None
        steps = body.steps_of(target)
        if steps < 1:
            return None
        ascii_bits, _, multibyte = body.body_of(target)
        if not self._bans_longer(target, steps, ascii_bits, multibyte):
            return None
        split = body_tokens(trie, ascii_bits, multibyte, skip_first=True)
        if not split.complete:
            return None
        plan = body_plan(trie, split)
        in_group = np.zeros(256, dtype=bool)
        in_group[:128] = np.unpackbits(np.frombuffer(group_bits.to_bytes(16, "little"), np.uint8), bitorder="little")
        keep = in_group[trie.pos_first[split.other_positions]]
        parts = [trie.pos_ids[self._others_alive(split, state, keep)]]
        nodes, states = [], []  # the root's children outside G, in their next states
        row = self._rows[state] or self._row(state)
        for byte in self._live_bytes(state):
            child = trie.child_of.get(byte)  # a child of the root (node 0): key (0 << 8) | byte
            if child is not None and not in_group[byte]:
                nodes.append(child)
                states.append(row[byte])
        if nodes:
            kept = self._wide_walk(np.array(nodes, dtype=np.int64), np.array(states, dtype=np.int64))
            parts.append(trie.pos_ids[kept])
        extra = np.concatenate(parts) if len(parts) > 1 else parts[0]
        return PlannedIds(plan, plan.row(steps), extra, group_bits, group_words(trie, plan, group_bits))

    def _bans_longer(self, state: int, steps: int, ascii_bits: int, multibyte: bool) -> bool:
        """True when a body token longer than `steps` characters dies: its next character is read in the state
        after the chain, which must kill every byte of the body (and every lead byte when it takes multi-byte)."""
        if steps == UNBOUNDED:
            return True
        after = self._body.after(state, steps)
        row = self._rows[after] or self._row(after)
        dead = self._dead
        if any(row[byte] != dead for byte in range(128) if ascii_bits >> byte & 1):
            return False
        return not multibyte or all(target == dead for target in row[0xC2:0xF5])

