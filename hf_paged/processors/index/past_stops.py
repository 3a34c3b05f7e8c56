"""Tokens past a rule's stop in a grammar automaton, decided without naming automaton states.

A walk on one rule's own table (`walk_kernel`) hands back the tokens that reach a stop: a call (the value of a
member, an array's item) or a finished callee (the closing quote of a string in a rule of its own). What the rest
of such a token does depends on the call stack. The automaton knows (`GrammarDFA`), but following a call there
names the callee's context, tens of microseconds, for a token that may never be sampled: a key's first visit
used to name a context per key token crossing into the value (`":{"`, `":["`, `":"`).

    alive        one token's rest, on call stacks of (rule, state) frames built from the stop state's own
                 context, stepped on the rules' own tables exactly as the automaton's closure would (calls
                 entered below MAX_DEPTH frames, near it as pruned copies: `grammar_depth`; callees returned from); the steps memoised per (stacks, byte), so
                 the tokens through one stop share them
    rests_alive  many tokens' rests (a string's closing quote in a rule of its own: ~100 GPT-2 tokens): on the
                 automaton's rows, every rest from one state in one compiled call (`walk_tokens`), the rows they
                 stop at built in one `ensure`, and on from there
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton.grammar_stacks import MAX_DEPTH
from hf_paged.processors.index.walk_kernel import pack_tokens, walk_tokens

__all__ = ["MANY_STOPS", "GrammarStops"]

MANY_STOPS = 32  # tokens past a rule's stop followed one by one on call stacks; more: on the automaton's rows
MAX_STACK_STEPS = 1 << 14  # memoised steps of call stacks (`_stacks_after`, ~1 KB each at depth 100), then cleared


class GrammarStops:
    """Decides token rests from stop states of a grammar automaton (`GrammarDFA`)."""

    def __init__(self, dfa):
        self.dfa = dfa
        self._steps: dict[tuple[frozenset, int | None], frozenset] = {}

    def alive(self, stop: int, rest: bytes) -> bool:
        """Whether the bytes `rest` keep the automaton alive from `stop` (a call or a finished callee)."""
        frames = self.dfa.frames(stop)
        if frames is None:  # a state of several stacks (rare): the automaton's rows
            return bool(self.rests_alive(np.array([stop], dtype=np.int64), [rest])[0])
        rules = self.dfa.rules
        if len(frames) < MAX_DEPTH:  # most often one callee reads all of it on its own table: alive
            for callee_index, _ in rules[frames[-1][0]].calls.get(frames[-1][1], ()):
                entered = self.dfa.limit.rule_at(callee_index, len(frames) + 1)  # (near the limit: a pruned copy)
                if entered is None:
                    continue
                callee = rules[entered]
                table, current, dead = callee.table, callee.initial, callee.dead
                for byte in rest:
                    current = table[current, byte]
                    if current == dead:
                        break
                else:
                    return True
        current = self._stacks_after(frozenset([frames]), None)
        for byte in rest:
            current = self._stacks_after(current, byte)
            if not current:
                return False
        return True

    def rests_alive(self, states: np.ndarray, rests: list[bytes]) -> np.ndarray:
        """Whether each byte string `rests[i]` keeps the automaton alive from `states[i]` (bool array)."""
        dfa = self.dfa
        rests = list(rests)
        alive = np.zeros(len(rests), dtype=bool)
        pending = np.arange(len(rests))
        current = states.astype(np.int64)
        while pending.shape[0]:
            dfa.ensure(current[pending])
            stopped = []
            for state in np.unique(current[pending]).tolist():
                group = pending[current[pending] == state]
                flat, offsets = pack_tokens([rests[i] for i in group.tolist()])
                walked = walk_tokens(state, dfa.transitions, dfa.known, dfa.dead, flat, offsets)
                alive[group[walked.outcome == 1]] = True
                halted = np.flatnonzero(walked.outcome == 2)  # at a row not built yet: on from there
                for i, depth, at in zip(group[halted].tolist(), walked.stop_depth[halted].tolist(),
                                        walked.stop_state[halted].tolist()):
                    rests[i] = rests[i][depth:]
                    current[i] = at
                    stopped.append(i)
            pending = np.array(stopped, dtype=np.int64)
        return alive

    def _stacks_after(self, stacks: frozenset, byte: int | None) -> frozenset:
        """The call stacks after `byte` from `stacks` (None: `stacks` themselves), closed under calls and returns."""
        key = (stacks, byte)
        found = self._steps.get(key)
        if found is None:
            if byte is None:
                moved = list(stacks)
            else:
                moved = []
                for stack in stacks:
                    rule_index, state = stack[-1]
                    rule = self.dfa.rules[rule_index]
                    following = int(rule.table[state, byte])
                    if following != rule.dead:
                        moved.append(stack[:-1] + ((rule_index, following),))
            found = frozenset(self._closure(moved)) if moved else frozenset()
            if len(self._steps) >= MAX_STACK_STEPS:
                self._steps.clear()
            self._steps[key] = found
        return found

    def _closure(self, stacks: list[tuple]) -> list[tuple]:
        """Every call stack reachable from `stacks` without reading a byte: calls entered while the stack holds
        fewer than `MAX_DEPTH` frames, callees returned from (`grammar_stacks.CallStacks.closure`, on frames)."""
        rules = self.dfa.rules
        seen = set(stacks)
        pending = list(stacks)
        while pending:
            stack = pending.pop()
            rule_index, state = stack[-1]
            rule = rules[rule_index]
            moves = []
            if len(stack) < MAX_DEPTH:
                for callee, back in rule.calls.get(state, ()):
                    entered = self.dfa.limit.rule_at(callee, len(stack) + 1)
                    if entered is not None:
                        moves.append(stack[:-1] + ((rule_index, back), (entered, rules[entered].initial)))
            if len(stack) > 1 and rule.finals[state]:
                moves.append(stack[:-1])  # (the caller's top holds its return state already)
            for move in moves:
                if move not in seen:
                    seen.add(move)
                    pending.append(move)
        return list(seen)
