"""Per automaton state, how many characters of a string body it takes for sure (`string_tokens` uses it to
decide string-body masks, counted ones (`maxLength`) included, without walking the vocabulary trie).

A state s has a body when a set of ASCII bytes A(s) all lead to one live state t(s) (its "step"); every
well-formed multi-byte character may lead there too (`multibyte`). Chaining steps, s -> t(s) -> t(t(s)) ...,
while every state on the chain sends exactly the bytes A to one live state, with the same `multibyte` flag:

    plain body   "[^"]*     t(s) = s                    steps(s) = unbounded
    counted body "[^"]{0,n} s_r -> s_(r-1) -> ... s_0   steps(s_r) = r   (s_0 takes only the closing quote)

`steps(s) >= m` means: every string of at most m characters, each an ASCII byte of A(s) or (when `multibyte`)
a well-formed multi-byte character, stays alive from s -- and so does such a string with one more character cut
short at the end, as long as that one is character number <= m (a prefix of a character that leads to a live
state is alive: the dead state is absorbing). All A bytes of a chain state go to the next one, so the state
after k characters is the state after k copies of any one byte of A (`after`).

Filled lazily: a chain in one vectorised pass (a 256-state counted string in ~0.3 ms instead of ~1.5 ms state by
state), the multi-byte ends all at once ahead of decoding (`prepare`), else per state on first use (~0.3 ms),
memoised.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hf_paged.processors.automaton.lazy_zeros import lazy_zeros_many
from hf_paged.processors.automaton.utf8 import multibyte_ends

__all__ = ["UNBOUNDED", "BodySteps"]

UNBOUNDED = 1 << 30  # steps of a state whose body loops on itself
_ENDS_OFFSET = 3  # `_ends` holds multibyte_ends + 3: 0 (zero-filled, so free until written) is "not computed"
_ALL_AT_ONCE = 2048  # an automaton up to this size computes every multi-byte end on first need when not prepared


class BodySteps:
    """The body of every automaton state, computed on first use.

    Args:
        transitions: the automaton's table, int32 `[S + 1, 256]` (dead state included).
        dead: the dead state.
        ensure: a grammar automaton's `ensure` (rows built on demand), called before rows are read; None: every
            row is built.
        ensure_path: a grammar automaton's `ensure_path`: a body's chain of rows built at once, before it is read.
        ends: a grammar automaton's `multibyte_ends` (per rule, renamed), instead of walking its rows.
    """

    def __init__(
        self,
        transitions: np.ndarray,
        dead: int,
        ensure: Callable[[np.ndarray], None] | None = None,
        ensure_path: Callable[[int, int], None] | None = None,
        ends: Callable[[np.ndarray], np.ndarray] | None = None,
    ):
        num_states = transitions.shape[0]
        # ascii: A(s) as two 64-bit words (bytes 0..127); _steps1: steps + 1, so that 0 is "not computed"; _ends:
        # `multibyte_ends` + _ENDS_OFFSET, per state on first use. Zero-filled arrays cost no memory until written (a
        # grammar automaton's capacity is a million states, most never named), on one mapping (`lazy_zeros_many`)
        self.ascii, self.multibyte, self._steps1, self._ends = lazy_zeros_many(
            ((num_states, 2), np.uint64), (num_states, np.bool_), (num_states, np.int64), (num_states, np.int64))
        self._table = transitions
        self._dead = dead
        self.dead = dead
        self._ensure = ensure
        self._ensure_path = ensure_path
        self._ends_of = ends
        self._body: dict[int, tuple[int, int, bool]] = {}  # state -> (A as int, t(s), multibyte)

    def prepare(self) -> None:
        """Compute the multi-byte ends of every state now (~0.7 us a state: a few percent of what building the
        automaton took) rather than state by state on the first visits of string bodies (~0.3 ms each)."""
        if self._ensure is None and (self._ends == 0).any():  # (rows built on demand: per state)
            self._ends = multibyte_ends(self._table) + _ENDS_OFFSET

    def multibyte_end(self, states: np.ndarray) -> np.ndarray:
        """`multibyte_ends` of `states` (int64 array), computed for the ones not seen yet."""
        unknown = states[self._ends[states] == 0]
        if unknown.shape[0]:
            if self._table.shape[0] <= _ALL_AT_ONCE and self._ensure is None:  # not prepared, but small: every state (~1 ms at most)
                self.prepare()
            else:
                unknown = np.unique(unknown)
                if self._ends_of is not None:
                    self._ends[unknown] = self._ends_of(unknown) + _ENDS_OFFSET
                else:
                    self._ends[unknown] = multibyte_ends(self._table, unknown, self._ensure) + _ENDS_OFFSET
        return self._ends[states] - _ENDS_OFFSET

    def ensure(self, states: np.ndarray) -> None:
        """Compute `steps` (and A, `multibyte`) of every state in `states` not seen yet."""
        unknown = states[self._steps1[states] == 0]
        if unknown.shape[0]:
            for state in np.unique(unknown).tolist():
                self._steps(state)

    def steps_of(self, state: int) -> int:
        """steps(state), computed on first use."""
        steps = int(self._steps1[state]) - 1
        return steps if steps >= 0 else self._steps(state)

    def body_of(self, state: int) -> tuple[int, int, bool]:
        """(A(state) as an int, t(state), multibyte); A is 0 and t the dead state when there is no body."""
        return self._look(state)

    def after(self, state: int, steps: int) -> int:
        """The state after `steps` characters of `state`'s body (at most `steps_of(state)`): every chain state
        sends all of A to the next one, so follow one byte of A (not the chain states' own bodies: a state met
        first on another chain may have recorded another body)."""
        bits = self._look(state)[0]
        byte = (bits & -bits).bit_length() - 1  # the lowest byte of A
        table = self._table
        if self._ensure_path is not None:
            self._ensure_path(state, byte)
        for _ in range(steps):
            self._one(state)
            state = int(table[state, byte])
        return state

    def _look(self, state: int) -> tuple[int, int, bool]:
        body = self._body.get(state)
        if body is None:
            self._one(state)
            ascii_row = self._table[state, :128]
            targets = ascii_row.tolist()
            live = set(targets) - {self._dead}
            if not live:
                body = (0, self._dead, False)
            else:
                target = max(live, key=targets.count)  # the body is the biggest group of ASCII bytes
                words = np.packbits(ascii_row == target, bitorder="little").view(np.uint64)
                end = int(self.multibyte_end(np.array([state], dtype=np.int64))[0])
                body = (int(words[0]) | int(words[1]) << 64, target, end == target)
                self.ascii[state] = words
                self.multibyte[state] = body[2]
            self._body[state] = body
        return body

    def _one(self, state: int) -> None:
        if self._ensure is not None:
            self._ensure(np.array([state]))

    @staticmethod
    def _ascii_members(bits: int) -> np.ndarray:
        """bool [128]: the bytes of the ASCII set `bits`."""
        return np.unpackbits(np.frombuffer(bits.to_bytes(16, "little"), dtype=np.uint8), bitorder="little") == 1

    def _steps(self, state: int) -> int:
        """steps(state): the chain from `state` (following one byte of its body A) checked in one vectorised pass,
        up to a loop, a state already known, or the first state that does not send exactly A to one live state
        with the same multibyte flag (a counted string's chain is hundreds of states: ~10 numpy calls in all
        instead of a few per state)."""
        bits, _, multibyte = self._look(state)
        if not bits:  # no body
            self._steps1[state] = 1
            return 0
        byte = (bits & -bits).bit_length() - 1  # the lowest byte of A: every chain state sends A to its next
        table, dead = self._table, self._dead
        if self._ensure_path is not None:
            self._ensure_path(state, byte)
        chain = [state]
        seen = {state}
        tail = -1  # steps of the state after the chain (-1: it takes no step of this body)
        while True:
            self._one(chain[-1])
            following = int(table[chain[-1], byte])
            if following == dead:
                break
            if following in seen:  # a loop: as many characters as wanted
                tail = UNBOUNDED
                break
            known = int(self._steps1[following]) - 1
            if known >= 0:
                look = self._look(following)
                if (look[0], look[2]) == (bits, multibyte):
                    tail = known
                    break  # (known in another body: it may still take a step of this one, checked below)
            chain.append(following)
            seen.add(following)
        # the longest prefix of the chain whose states all send exactly A to one live state, same multibyte flag
        states = np.array(chain, dtype=np.int64)
        rows = table[states, :128]
        targets = rows[:, byte]
        ok = ((rows == targets[:, None]) == self._ascii_members(bits)).all(axis=1) & (targets != dead)
        ok &= (self.multibyte_end(states) == targets) == multibyte
        broken = np.flatnonzero(~ok)
        if broken.shape[0]:
            states, tail = states[: broken[0]], -1
        words = np.frombuffer(bits.to_bytes(16, "little"), dtype=np.uint64)
        total = UNBOUNDED if tail == UNBOUNDED else max(tail, 0)
        for member, target in zip(reversed(states.tolist()), reversed(targets[: states.shape[0]].tolist())):
            if total != UNBOUNDED:
                total += 1
            own = self._body.get(member)
            if own is None:  # (A is this state's own biggest group or not, the chain facts hold)
                own = self._body[member] = (bits, target, multibyte)
                self.ascii[member] = words
                self.multibyte[member] = multibyte
            if self._steps1[member] == 0 and (own[0], own[2]) == (bits, multibyte):  # steps count in its own A
                self._steps1[member] = total + 1
        self._steps1[state] = max(self._steps1[state], 1)  # (unknown cannot stay: A is `state`'s own group)
        return int(self._steps1[state]) - 1
