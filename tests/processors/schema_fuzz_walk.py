"""Random walks through a compiled byte automaton (a `ByteDFA`, or a `GrammarDFA` whose rows are built as the walk
reaches them), for the schema fuzz (`test_schema_fuzz.py`): documents the automaton accepts, drawn from it.

A walk takes random live bytes for a random number of steps, then the shortest way to a final state. A live state
with no way to a final state is a dead end: a constraint that lets a model in and never out. The searches for
shortest ways share a budget of states (work, never time): a grammar whose every state is a new stack of calls
gives up its remaining walks, not the test's minutes.
"""

from __future__ import annotations

import collections
import random
from dataclasses import dataclass

import numpy as np

__all__ = ["Sample", "Walker"]

MAX_VISITS = 5_000  # states the shortest-way searches of one automaton may expand, all walks together


@dataclass(slots=True)
class Sample:
    """One walk's outcome."""

    text: bytes | None  # the accepted document; None when the search budget ran out or at a dead end
    dead_end: bytes | None = None  # the prefix that leads to a live state no byte sequence completes


class Walker:
    """Walks of one automaton; each state's live bytes are grouped by the state they lead to (memoised)."""

    def __init__(self, dfa, max_visits: int = MAX_VISITS):
        self.dfa = dfa
        self.visits_left = max_visits
        self._groups: dict[int, list[tuple[int, list[int]]]] = {}

    def final(self, state: int) -> bool:
        self.dfa.ensure_one(state)
        return bool(self.dfa.finals[state])

    def groups(self, state: int) -> list[tuple[int, list[int]]]:
        """(next state, the bytes that lead there) for every live byte of `state`."""
        found = self._groups.get(state)
        if found is None:
            self.dfa.ensure_one(state)
            row = np.asarray(self.dfa.transitions[state])
            by_target: dict[int, list[int]] = collections.defaultdict(list)
            for byte in np.flatnonzero(row != self.dfa.dead).tolist():
                by_target[int(row[byte])].append(byte)
            found = self._groups[state] = list(by_target.items())
        return found

    def complete(self, state: int, rng: random.Random) -> bytes | str | None:
        """A shortest byte path from `state` to a final state (ties broken at random); "dead end" when there is
        none; None when the search budget ran out."""
        if self.final(state):
            return b""
        parent: dict[int, tuple[int, int] | None] = {state: None}
        queue = collections.deque([state])
        while queue:
            if self.visits_left <= 0:
                return None
            self.visits_left -= 1
            current = queue.popleft()
            groups = self.groups(current)
            order = list(range(len(groups)))
            rng.shuffle(order)
            for i in order:
                target, byte_values = groups[i]
                if target in parent:
                    continue
                parent[target] = (current, rng.choice(byte_values))
                if self.final(target):
                    return _path(parent, target)
                queue.append(target)
        return "dead end"

    def sample(self, rng: random.Random, steps: int) -> Sample:
        """Up to `steps` random bytes (stopping early, sometimes, in a final state), then the shortest completion.
        Three in four steps pick a next state, then a byte into it (rare states get their share); the rest pick
        among all live bytes."""
        state = self.dfa.initial
        out = bytearray()
        for _ in range(steps):
            if self.final(state) and rng.random() < 0.12:
                return Sample(bytes(out))
            groups = self.groups(state)
            if not groups:
                break
            if rng.random() < 0.75:
                state, byte_values = rng.choice(groups)
                byte = rng.choice(byte_values)
            else:
                byte = rng.choice([b for _, byte_values in groups for b in byte_values])
                state = int(self.dfa.transitions[state, byte])
            out.append(byte)
        tail = self.complete(state, rng)
        if tail is None:
            return Sample(None)
        if tail == "dead end":
            return Sample(None, dead_end=bytes(out))
        return Sample(bytes(out) + tail)


def _path(parent: dict[int, tuple[int, int] | None], state: int) -> bytes:
    path = []
    step = parent[state]
    while step is not None:
        state, byte = step
        path.append(byte)
        step = parent[state]
    return bytes(reversed(path))
