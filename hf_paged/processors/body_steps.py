"""Per automaton state, how many characters of a string body it takes for sure (`body_tokens` uses it to
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

Filled lazily, state by state (~10 us a state; the multi-byte ends of all states at once on first use, ~0.5 ms
for 600 states), and memoised along the chain.
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.utf8_bodies import multibyte_ends

__all__ = ["UNBOUNDED", "BodySteps"]

UNBOUNDED = 1 << 30  # steps of a state whose body loops on itself


class BodySteps:
    """The body of every automaton state, computed on first use.

    Args:
        transitions: the automaton's table, int32 `[S + 1, 256]` (dead state included).
        dead: the dead state.
    """

    def __init__(self, transitions: np.ndarray, dead: int):
        num_states = transitions.shape[0]
        self.ascii = np.zeros((num_states, 2), dtype=np.uint64)  # A(s) as two 64-bit words (bytes 0..127)
        self.multibyte = np.zeros(num_states, dtype=bool)
        self.steps = np.full(num_states, -1, dtype=np.int64)  # -1: not computed yet
        self._table = transitions
        self._dead = dead
        self._multibyte_ends: np.ndarray | None = None  # `multibyte_ends`, on first use (~1 ms for 2k states)
        self._body: dict[int, tuple[int, int, bool]] = {}  # state -> (A as int, t(s), multibyte)

    def prepare(self, max_states: int = 8192) -> None:
        """Compute the multi-byte ends of every state now (~0.6 ms for 600 states) rather than on the first
        visit of a string body; skipped for automata over `max_states` (then it waits for that visit)."""
        if self._multibyte_ends is None and self._table.shape[0] <= max_states:
            self._multibyte_ends = multibyte_ends(self._table)

    def ensure(self, states: np.ndarray) -> None:
        """Compute `steps` (and A, `multibyte`) of every state in `states` not seen yet."""
        unknown = states[self.steps[states] < 0]
        if unknown.shape[0]:
            for state in np.unique(unknown).tolist():
                self._steps(state)

    def steps_of(self, state: int) -> int:
        """steps(state), computed on first use."""
        steps = int(self.steps[state])
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
        for _ in range(steps):
            state = int(table[state, byte])
        return state

    def _look(self, state: int) -> tuple[int, int, bool]:
        body = self._body.get(state)
        if body is None:
            ascii_row = self._table[state, :128]
            targets = ascii_row.tolist()
            live = set(targets) - {self._dead}
            if not live:
                body = (0, self._dead, False)
            else:
                target = max(live, key=targets.count)  # the body is the biggest group of ASCII bytes
                words = np.packbits(ascii_row == target, bitorder="little").view(np.uint64)
                if self._multibyte_ends is None:
                    self._multibyte_ends = multibyte_ends(self._table)
                body = (int(words[0]) | int(words[1]) << 64, target, int(self._multibyte_ends[state]) == target)
                self.ascii[state] = words
                self.multibyte[state] = body[2]
            self._body[state] = body
        return body

    @staticmethod
    def _ascii_members(bits: int) -> np.ndarray:
        """bool [128]: the bytes of the ASCII set `bits`."""
        return np.unpackbits(np.frombuffer(bits.to_bytes(16, "little"), dtype=np.uint8), bitorder="little") == 1

    def _same_body(self, state: int, body: tuple[int, int, bool], members: np.ndarray) -> tuple[int, int, bool] | None:
        """`state`'s body when it is `body`'s A and multibyte flag (checked with three numpy calls instead of
        `_look`'s dozen: a counted string's chain is hundreds of such states), else None."""
        if not body[0] or self._multibyte_ends is None:  # no body (or never looked: `_look` sets the ends)
            return None
        ascii_row = self._table[state, :128]
        target = int(ascii_row[members.argmax()])
        if target == self._dead or not np.array_equal(ascii_row == target, members):
            return None
        multibyte = int(self._multibyte_ends[state]) == target
        if multibyte != body[2]:
            return None
        same = (body[0], target, multibyte)
        if state not in self._body:  # (A is this state's own biggest group or not, the chain facts hold)
            self._body[state] = same
            self.ascii[state] = np.frombuffer(body[0].to_bytes(16, "little"), dtype=np.uint64)
            self.multibyte[state] = multibyte
        return same

    def _steps(self, state: int) -> int:
        """steps(state), walking the chain until a known state, a change of body, or a loop."""
        chain: list[int] = []
        members: set[int] = set()
        current = state
        first = self._look(state)
        tail = 0  # steps of the state after the chain's last one
        members_of = self._ascii_members(first[0])
        while True:
            bits, target, multibyte = self._same_body(current, first, members_of) or self._look(current)
            if (bits, multibyte) != (first[0], first[2]) or target == self._dead or not bits:
                tail = -1  # `current` takes no step of this body: the chain before it ends here
                break
            chain.append(current)
            members.add(current)
            if target in members:  # a loop: as many characters as wanted
                tail = UNBOUNDED
                break
            known = int(self.steps[target])
            if known >= 0 and (self._look(target)[0], self._look(target)[2]) == (first[0], first[2]):
                tail = known
                break
            current = target
        # chain[i] steps to chain[i + 1]; the last one steps to a state taking `tail` more (or none: -1 -> 0)
        total = UNBOUNDED if tail == UNBOUNDED else max(tail, 0)
        for member in reversed(chain):
            if total != UNBOUNDED:
                total += 1
            own = self._body[member]
            if self.steps[member] < 0 and (own[0], own[2]) == (first[0], first[2]):  # steps count in its own A
                self.steps[member] = total
        if not chain:  # `state` itself has no body
            self.steps[state] = 0
        return int(self.steps[state])
