"""Which tokens of a vocabulary trie keep one byte-automaton state alive: the walk behind `TokenIndex`'s masks.

Three ways over the (node, DFA state) pairs still alive, chosen per pair:

    narrow state (<= NARROW_BYTES live bytes: keys, punctuation, numbers)
        node by node in Python, following only the live bytes (dict lookups, no numpy call)
    wide state (a string body), or a narrow walk that grew past PYTHON_LOOKUPS
        level by level with numpy:  frontier --children--> T[state, byte] --dead? drop--> next frontier
    at most TAIL_TOKENS tokens left under the frontier (deep runs of multi-byte characters)
        token by token in Python over their remaining bytes

Shortcut on every path: when every byte below a node loops on the node's state (`T[s, b] == s`, a string body),
every token of the subtree is allowed: its contiguous DFS slice is taken without descending.

Before any of that, a wide state with a string body (`body_steps`: plain or counted, `[^"]{0,n}` included) is
decided from the vocabulary's body split (`body_tokens`): one comparison over the vocabulary plus an exact walk
of the few hundred tokens holding a quote, a backslash, a control byte or malformed UTF-8 (~0.1-0.2 ms, where
the trie walk took 0.4-0.9 ms for a plain body and 1-7 ms for a counted one). A state whose biggest group of
bytes leads into such a body (the first character of a free-form key) is decided the same way on the bytes past
the first, and walks the trie only below the other first bytes.
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.body_steps import UNBOUNDED, BodySteps
from hf_paged.processors.body_tokens import BodyTokens, body_tokens, walk_others
from hf_paged.processors.byte_dfa import ByteDFA
from hf_paged.processors.token_trie import TokenTrie

__all__ = ["TrieWalk"]

PYTHON_IDS = 256  # the Python walk hands back a list when it found at most this many tokens
# below this many tokens left under the frontier, finish token by token in Python: a level costs ~15 numpy calls
# (~20 us) and a deep subtree (long runs of multi-byte characters) is tens of levels for a handful of tokens
TAIL_TOKENS = 128
NARROW_BYTES = 16  # a state with at most this many live bytes is walked node by node in Python
PYTHON_LOOKUPS = 256  # ... for at most this many child lookups; what is left then goes to the numpy walk


class TrieWalk:
    """Per-state Python views of a `ByteDFA` (filled on first use: a big automaton has thousands of states, most
    never seen) and the trie walk over them.

    Args:
        dfa: the byte automaton.
        trie: the vocabulary trie.
        tail_tokens: finish the walk token by token once at most this many tokens remain under the frontier.
        narrow_bytes: states with at most this many live bytes are walked node by node in Python.
    """

    def __init__(self, dfa: ByteDFA, trie: TokenTrie, tail_tokens: int = TAIL_TOKENS, narrow_bytes: int = NARROW_BYTES):
        self.dfa = dfa
        self.trie = trie
        self.tail_tokens = tail_tokens
        self.narrow_bytes = narrow_bytes
        self._dead = dfa.dead
        self._has_loops = dfa.loops.any(axis=1)
        self._rows: list[list[int] | None] = [None] * (dfa.num_states + 1)  # state -> next state per byte
        self._leaving: list[int | None] = [None] * (dfa.num_states + 1)  # state -> bytes that move it (bit set)
        self._live: list[list[tuple[int, int]] | None] = [None] * (dfa.num_states + 1)  # state -> (byte, next)
        self.use_bodies = True  # the `body_tokens` path for string bodies (off: trie walk only, for tests)
        self._body = BodySteps(dfa.transitions, self._dead)

    def next_state(self, state: int, raw: bytes) -> int | None:
        """The state after the bytes `raw`, or None when they reach the dead state (a few list reads a byte)."""
        rows, dead = self._rows, self._dead
        for byte in raw:
            state = (rows[state] or self._row(state))[byte]
            if state == dead:
                return None
        return state

    def _row(self, state: int) -> list[int]:
        row = self._rows[state] = self.dfa.transitions[state].tolist()
        return row

    def _leaving_set(self, state: int) -> int:
        leaving = self._leaving[state]
        if leaving is None:
            loops = int.from_bytes(self.dfa.loops[state].tobytes(), "little")
            leaving = self._leaving[state] = ((1 << 256) - 1) ^ loops
        return leaving

    def allowed(self, state: int) -> list[int] | np.ndarray:
        """The allowed regular ids of `state`: a list when the Python walk found few, else an int64 array.

        Narrow states (at most `NARROW_BYTES` live bytes: keys, punctuation, numbers) are walked node by node in
        Python, following only their live bytes; wide pairs (a string body) go to the numpy level walk.
        """
        trie = self.trie
        if len(self._live_bytes(state)) > self.narrow_bytes:
            found = self._body_allowed(state)
            if found is not None:
                return found
        pos_start, pos_end, sub_set, child_of = trie.pos_start, trie.pos_end, trie.sub_set, trie.child_of
        ranges: list[tuple[int, int]] = []  # DFS position ranges of allowed tokens
        wide_nodes: list[int] = []
        wide_states: list[int] = []
        stack = [(0, state)]
        budget = PYTHON_LOOKUPS
        while stack:
            if budget < 0:  # a wide subtree after all (e.g. every token made of digits): numpy from here on
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
            for byte, following in live:
                child = child_of.get(base | byte)
                if child is not None:
                    stack.append((child, following))
        if not wide_nodes and sum(end - start for start, end in ranges) <= PYTHON_IDS:
            pos_id_list = trie.pos_id_list
            return [pos_id_list[p] for start, end in ranges for p in range(start, end)]
        starts = [np.array([r[0] for r in ranges], dtype=np.int64)]
        ends = [np.array([r[1] for r in ranges], dtype=np.int64)]
        if wide_nodes:
            kept = self._numpy_walk(np.array(wide_nodes), np.array(wide_states), starts, ends)
            if kept.shape[0]:  # single allowed positions
                ids = self._ranges_to_ids(np.concatenate(starts), np.concatenate(ends))
                return np.concatenate([ids, trie.pos_ids[kept]])
        ids = self._ranges_to_ids(np.concatenate(starts), np.concatenate(ends))
        return ids

    def prepare(self) -> None:
        """Per-automaton facts the string-body path needs (`BodySteps.prepare`), ahead of the first visit."""
        self._body.prepare()

    def _body_allowed(self, state: int) -> np.ndarray | None:
        """The allowed ids of a state from the vocabulary's body split (`body_tokens`): its own body, else the
        body its biggest group of ASCII bytes leads to (a key's first character, then the key's body); None when
        neither decides it."""
        if not self.use_bodies:
            return None
        body = self._body
        steps = body.steps_of(state)
        if steps >= 1:
            ascii_bits, _, multibyte = body.body_of(state)
            if self._bans_longer(state, steps, ascii_bits, multibyte):
                split = body_tokens(self.trie, ascii_bits, multibyte)
                if split.complete:
                    return self._body_ids(split, steps, state, None)
        return self._first_byte_allowed(state)

    def _first_byte_allowed(self, state: int) -> np.ndarray | None:
        """Tokens whose first byte is in the state's biggest ASCII group G (all lead to one state t with a body):
        their bytes past the first from t's body split; the others (first byte outside G) by the trie walk."""
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
        in_group = np.zeros(256, dtype=bool)
        in_group[:128] = np.unpackbits(np.frombuffer(group_bits.to_bytes(16, "little"), np.uint8), bitorder="little")
        first_in = in_group[trie.pos_first]
        keep = first_in[split.other_positions]
        found = self._body_ids(split, steps, state, first_in, keep)
        nodes, states = [], []  # the root's children outside G, in their next states
        for byte, following in self._live_bytes(state):
            child = trie.child_of.get(byte)  # a child of the root (node 0): key (0 << 8) | byte
            if child is not None and not in_group[byte]:
                nodes.append(child)
                states.append(following)
        if not nodes:
            return found
        starts: list[np.ndarray] = []
        ends: list[np.ndarray] = []
        singles = self._numpy_walk(np.array(nodes, dtype=np.int64), np.array(states, dtype=np.int64), starts, ends)
        parts = [found, trie.pos_ids[singles]]
        if starts:
            parts.append(self._ranges_to_ids(np.concatenate(starts), np.concatenate(ends)))
        return np.concatenate(parts)

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

    def _body_ids(
        self, split: BodyTokens, steps: int, state: int, first_in: np.ndarray | None, keep: np.ndarray | None = None
    ) -> np.ndarray:
        """Ids of the body tokens that fit `steps` (only those whose first byte is in the group, if given) and of
        the other tokens (those in `keep`) that `state` lets through."""
        chars = split.chars
        inside = chars >= 0 if steps == UNBOUNDED else (chars >= 0) & (chars <= steps)
        if first_in is not None:
            inside &= first_in
        kept = walk_others(split, self.dfa.transitions, state, self._dead, keep)
        pos_ids = self.trie.pos_ids
        return np.concatenate([pos_ids[np.flatnonzero(inside)], pos_ids[kept]])

    def is_narrow(self, state: int) -> bool:
        """True when `state` is walked node by node in Python (its masks are cheap: tens of microseconds)."""
        return len(self._live_bytes(state)) <= self.narrow_bytes

    def _live_bytes(self, state: int) -> list[tuple[int, int]]:
        live = self._live[state]
        if live is None:
            dead = self._dead
            row = self.dfa.transitions[state]
            live_bytes = np.flatnonzero(row != dead)
            live = self._live[state] = list(zip(live_bytes.tolist(), row[live_bytes].tolist()))
        return live

    def _numpy_walk(
        self, nodes: np.ndarray, states: np.ndarray, starts: list[np.ndarray], ends: list[np.ndarray]
    ) -> np.ndarray:
        """Level-by-level walk of wide (node, state) pairs; appends position ranges, returns single positions."""
        trie, dfa = self.trie, self.dfa
        table, dead = dfa.transitions, self._dead
        while nodes.shape[0]:
            if self._has_loops[states].any():
                # shortcut: every byte below the node loops on its state -> the whole subtree is allowed
                below, loops = trie.sub_bytes[nodes], dfa.loops[states]
                # four 64-bit words compared column by column: 2x faster than `.any(axis=1)` on [n, 4]
                whole = (
                    (below[:, 0] & ~loops[:, 0])
                    | (below[:, 1] & ~loops[:, 1])
                    | (below[:, 2] & ~loops[:, 2])
                    | (below[:, 3] & ~loops[:, 3])
                ) == 0
                if whole.any():
                    taken = nodes[whole]
                    starts.append(trie.pos_ptr[taken])
                    ends.append(trie.sub_end[taken])
                    keep = ~whole
                    nodes, states = nodes[keep], states[keep]
                    if nodes.shape[0] == 0:
                        break
            if int((trie.sub_end[nodes] - trie.pos_ptr[nodes]).sum()) <= self.tail_tokens:
                return np.array(self._walk_tokens(nodes.tolist(), states.tolist()), dtype=np.int64)
            # the tokens ending at each frontier node (the root ends none)
            starts.append(trie.pos_ptr[nodes])
            ends.append(trie.pos_ptr[nodes + 1])
            # descend: every child of every frontier node, in its parent's state, then drop the dead
            first = trie.child_ptr[nodes]
            counts = trie.child_ptr[nodes + 1] - first
            total = int(counts.sum())
            if total == 0:
                break
            offsets = np.repeat(first - (np.cumsum(counts) - counts), counts)
            children = trie.child_ids[np.arange(total) + offsets]
            following = table[np.repeat(states, counts), trie.node_byte[children]]
            alive = following != dead
            nodes, states = children[alive], following[alive].astype(np.int64)
        return np.zeros(0, dtype=np.int64)

    def _walk_tokens(self, nodes: list[int], states: list[int]) -> list[int]:
        """Positions of the tokens under `nodes` (each in its state) whose remaining bytes stay alive."""
        trie, rows, dead = self.trie, self._rows, self._dead
        pos_ptr, sub_end, pos_bytes = trie.pos_ptr, trie.sub_end, trie.pos_bytes
        kept: list[int] = []
        for node, start_state in zip(nodes, states):
            depth = trie.depth[node]
            for position in range(int(pos_ptr[node]), int(sub_end[node])):
                current = start_state
                for byte in pos_bytes[position][depth:]:
                    current = (rows[current] or self._row(current))[byte]
                    if current == dead:
                        break
                else:
                    kept.append(position)
        return kept

    def _ranges_to_ids(self, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
        """Token ids at the disjoint DFS position ranges [starts, ends)."""
        lengths = ends - starts
        nonempty = lengths > 0
        starts, lengths = starts[nonempty], lengths[nonempty]
        total = int(lengths.sum())
        pos_ids = self.trie.pos_ids
        if total * 8 < pos_ids.shape[0]:  # few tokens: enumerate the positions
            offsets = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)
            return pos_ids[np.arange(total) + offsets]
        # many: mark range boundaries and prefix-sum them (ranges are disjoint)
        delta = np.zeros(pos_ids.shape[0] + 1, dtype=np.int32)
        delta[starts] += 1  # disjoint non-empty ranges: starts are distinct, and so are ends (no `np.add.at`)
        delta[starts + lengths] -= 1
        return pos_ids[np.cumsum(delta[:-1]) > 0]
