"""String-body facts (`string_steps.BodySteps`) of a grammar automaton's states, from their rules' own automata.

A state inside a rule (one configuration, no call, not a finished callee) has its rule state's row, renamed into
its context's block of states (`grammar_dfa`). So its body, its count of body characters and the state after k of
them are its rule state's, renamed: computed once per rule state on the rule's own table (one `BodySteps` per
rule), not once per context, and without building the rows of a counted string's chain (256 characters: 256 rows
per string value otherwise). A state whose chain meets a call or a rule's end in its rule falls back to the
automaton's own rows.
"""

from __future__ import annotations

from hf_paged.processors.automaton.string_steps import UNBOUNDED, BodySteps

__all__ = ["GrammarBodySteps"]


class GrammarBodySteps:
    """`BodySteps`' reading API (`steps_of`, `body_of`, `after`, `prepare`) for a `GrammarDFA`, rule by rule on
    first need.

    Args:
        dfa: the grammar automaton.
        fallback: `BodySteps` over the automaton's own rows (built on demand), for the states not inside a rule.
    """

    def __init__(self, dfa, fallback: BodySteps):
        self.dfa = dfa
        self.fallback = fallback
        self._rules: dict[int, BodySteps] = {}  # rule -> BodySteps over the rule's table
        self._clean: dict[tuple[int, int], bool] = {}  # (rule, rule state) -> its chain stays inside the rule

    def prepare(self) -> None:
        """Every rule's multi-byte ends (~0.7 us a rule state), ahead of decoding's first visits: run off the
        caller's path (`TokenIndex.prepare`); a rule a walk needs before that gets its ends all at once then
        (`_steps`), rather than ~0.3 ms a state in a big rule."""
        for rule_index in range(len(self.dfa.rules)):
            self._steps(rule_index)

    def steps_of(self, state: int) -> int:
        inside = self._inside(state)
        if inside is None:
            return self.fallback.steps_of(state)
        _, steps, rule_state = inside
        return steps.steps_of(rule_state)

    def body_of(self, state: int) -> tuple[int, int, bool]:
        inside = self._inside(state)
        if inside is None:
            return self.fallback.body_of(state)
        base, steps, rule_state = inside
        bits, target, multibyte = steps.body_of(rule_state)
        return bits, self._rename(base, steps, target), multibyte

    def after(self, state: int, count: int) -> int:
        inside = self._inside(state)
        if inside is None:
            return self.fallback.after(state, count)
        base, steps, rule_state = inside
        return self._rename(base, steps, steps.after(rule_state, count))

    @staticmethod
    def _rename(base: int, steps: BodySteps, rule_state: int) -> int:
        return 0 if rule_state == steps.dead else base + rule_state

    def _inside(self, state: int) -> tuple[int, BodySteps, int] | None:
        """(context base, the rule's BodySteps, rule state) of a state whose chain stays inside its rule."""
        found = self.dfa.inside(state)
        if found is None:
            return None
        base, rule_index, rule_state = found
        steps = self._steps(rule_index)
        clean = self._clean.get((rule_index, rule_state))
        if clean is None:
            clean = self._chain_inside(rule_index, steps, rule_state)
        return (base, steps, rule_state) if clean else None

    def _steps(self, rule_index: int) -> BodySteps:
        steps = self._rules.get(rule_index)
        if steps is None:
            rule = self.dfa.rules[rule_index]
            steps = self._rules[rule_index] = BodySteps(rule.table, rule.dead)
            steps.prepare()  # (the whole rule's multi-byte ends, once)
        return steps

    def _chain_inside(self, rule_index: int, steps: BodySteps, rule_state: int) -> bool:
        """Whether every state of `rule_state`'s body chain is neither a call nor a rule's end (rows renamed
        exactly). Memoised for every state of the chain walked: a counted string's chain is hundreds of states,
        and its decoding visits them one after the other."""
        rule = self.dfa.rules[rule_index]
        count = steps.steps_of(rule_state)
        bits = steps.body_of(rule_state)[0]
        if not bits:
            clean = not (rule.has_calls[rule_state] or rule.finals[rule_state])
            self._clean[rule_index, rule_state] = clean
            return clean
        byte = (bits & -bits).bit_length() - 1
        chain, seen, clean = [], set(), True
        current = rule_state
        for _ in range(count + 1 if count != UNBOUNDED else rule.table.shape[0]):
            if current == rule.dead or current in seen:
                break
            known = self._clean.get((rule_index, current))
            if known is not None and current != rule_state and self._same_body(steps, current, bits):
                clean = known  # the rest of this chain was walked before
                break
            if rule.has_calls[current] or rule.finals[current]:
                clean = False
                break
            seen.add(current)
            chain.append(current)
            current = int(rule.table[current, byte])
        if clean:  # every state walked has a clean rest of chain (a dirty one: only the first is known dirty)
            for member in chain:
                if self._same_body(steps, member, bits):
                    self._clean[rule_index, member] = True
        self._clean[rule_index, rule_state] = clean
        return clean

    @staticmethod
    def _same_body(steps: BodySteps, state: int, bits: int) -> bool:
        """Whether `state`'s own body is `bits` (its chain then follows the same byte: its facts are the ones
        walked here)."""
        return steps.body_of(state)[0] == bits
