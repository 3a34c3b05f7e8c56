"""Call stacks of a grammar (`grammar_dfa`'s configurations): closures, and the subset step on every byte.

A configuration is a stack of (rule, state) pairs flattened into one tuple, the callers' return states below and
the current position on top: (rule, return state, ..., rule, state). A state of the grammar's automaton is a set of
them; reading a byte moves every configuration of the set's closure along its top rule's edge.

    closure   every configuration reachable from one without reading a byte: calls entered (below MAX_DEPTH
              frames; near it, the callee's copy pruned to what can end in the levels left, `grammar_depth`),
              finished callees returned from (the caller's top is its return state already)
    is_final  the closure holds the root, uncalled, in a final state
    step      the sets of next configurations of a set of configurations, one per distinct column of next rule
              states, and which byte leads to which (the row of a boundary state, before its sets are named)

Pure over the grammar's rules (`grammar_rules.Rule`): no automaton state is named here.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from hf_paged.errors import InvalidRegexError
from hf_paged.processors.automaton.grammar_depth import MAX_DEPTH, NestingLimit
from hf_paged.processors.automaton.grammar_rules import Rule

__all__ = ["MAX_DEPTH", "CallStacks"]


class CallStacks:
    """The configurations of one grammar's rules, their closures memoised (the caller serialises access).

    Args:
        rules: the grammar's rules, the root first (`grammar_rules`), and the pruned copies `limit` adds.
        limit: which rule a call enters at each depth (`grammar_depth.NestingLimit`).
    """

    def __init__(self, rules: list[Rule], limit: NestingLimit) -> None:
        self.rules = rules
        self.limit = limit
        self._closures: dict[tuple, list[tuple]] = {}

    def closure(self, config: tuple) -> list[tuple]:
        """Every configuration reachable from `config` without reading a byte (calls entered, returns taken)."""
        found = self._closures.get(config)
        if found is not None:
            return found
        seen = {config}
        order = [config]
        pending = [config]
        rules = self.rules
        while pending:
            current = pending.pop()
            rule, state = current[-2], current[-1]
            moves = []
            if len(current) < 2 * MAX_DEPTH:
                for callee, back in rules[rule].calls.get(state, ()):
                    if not 0 < callee < self.limit.num_rules:  # (a text that spells a mark byte some other way)
                        raise InvalidRegexError(f"rule {rule} calls rule {callee}, which the grammar does not have")
                    entered = self.limit.rule_at(callee, len(current) // 2 + 1)  # (None: it cannot end that deep)
                    if entered is not None:
                        moves.append(current[:-1] + (back, entered, rules[entered].initial))
            if len(current) > 2 and rules[rule].finals[state]:
                moves.append(current[:-2])  # the caller's top is its return state already
            for move in moves:
                if move not in seen:
                    seen.add(move)
                    order.append(move)
                    pending.append(move)
        self._closures[config] = order
        return order

    def is_final(self, config: tuple) -> bool:
        """Whether a document may end here: the closure holds the root rule, uncalled, in a final state."""
        root = self.rules[0]
        return any(len(c) == 2 and root.finals[c[1]] for c in self.closure(config))

    def step(self, configs: Iterable[tuple]) -> tuple[list[frozenset], np.ndarray]:
        """The subset step of configurations (their closures already taken) on every byte: the distinct sets of
        next configurations (an empty one for dead bytes), and per byte (int64 [256]) the index of its set."""
        moving = []  # (configuration, its top rule's row with -1 for dead) for the configurations with a live byte
        for config in dict.fromkeys(configs):
            rule = self.rules[config[-2]]
            targets = rule.table[config[-1]]
            if (targets != rule.dead).any():
                moving.append((config, np.where(targets == rule.dead, -1, targets)))
        if not moving:
            return [frozenset()], np.zeros(256, dtype=np.int64)
        stack = np.stack([t for _, t in moving])  # [configurations, 256]: next rule state, -1 dead
        # one key per byte for its column of next states (mixed radix; `np.unique(axis=1)` costs ~0.1 ms)
        radix = int(stack.max()) + 2
        if radix ** stack.shape[0] < 1 << 62:
            weights = radix ** np.arange(stack.shape[0], dtype=np.int64)
            _, first, inverse = np.unique(((stack + 1) * weights[:, None]).sum(axis=0), return_index=True,
                                          return_inverse=True)
            columns = stack[:, first]
        else:
            columns, inverse = np.unique(stack, axis=1, return_inverse=True)
        sets = [frozenset(c[:-1] + (t,) for (c, _), t in zip(moving, column) if t >= 0)
                for column in columns.T.tolist()]
        return sets, inverse.reshape(-1)
