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

Before any of that, a wide state with a string body (`string_steps`: plain or counted, `[^"]{0,n}` included) is
decided from the vocabulary's body split (`string_tokens`) and its plan (`string_masks`): a row of per-vocabulary
bitmask words plus an exact walk of the few hundred tokens holding a quote, a backslash, a control byte or
malformed UTF-8 (`_others_alive`; `decide` returns a `PlannedIds`). So is a grammar state from which every string
of key characters stays alive (`closed_states`: the prefixes of a free-form key, whatever names they may still
spell), with the plan of all key-body tokens. A state whose biggest group of bytes leads into a body (the first
character of a free-form key) is decided the same way on the bytes past the first, and walks the trie only below
the other first bytes.
"""

from __future__ import annotations

from array import array

import numpy as np

from hf_paged.processors.automaton.byte_dfa import ByteDFA
from hf_paged.processors.automaton.grammar_string_steps import GrammarBodySteps
from hf_paged.processors.automaton.string_steps import UNBOUNDED, BodySteps
from hf_paged.processors.index.closed_states import closed_states
from hf_paged.processors.index.past_stops import GrammarStops
from hf_paged.processors.index.string_masks import PlannedIds, body_plan, group_words, set_bits
from hf_paged.processors.index.string_tokens import JSON_KEY_ASCII, BodyTokens, body_tokens
from hf_paged.processors.index.token_trie import TokenTrie, ranges_to_ids
from hf_paged.processors.index.walk_kernel import walk_marked, walk_pairs, walk_tokens

__all__ = ["TrieWalk"]

PYTHON_IDS = 256  # the Python walk hands back a list when it found at most this many tokens
NARROW_BYTES = 16  # a state with at most this many live bytes is narrow (a walk of a few subtrees)
PYTHON_LOOKUPS = 256  # the Python walk takes at most this many child lookups; what is left goes to the compiled walk
MANY_STOPS = 32  # tokens past a rule's stop followed one by one on call stacks; more: on the automaton's rows


class _Sparse(dict):
    """A dict read like the per-state lists: a state not seen yet gives None."""

    def __missing__(self, key: int) -> None:
        return None


class TrieWalk:
    """Per-state Python views of a `ByteDFA` (filled on first use: a big automaton has thousands of states, most
    never seen) and the trie walk over them.

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
            narrow = self._rule_narrow[rule_index] = self.dfa.rules[rule_index].live.sum(axis=1) <= self.narrow_bytes
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
