"""A grammar of regexes that call each other (rules), as a byte automaton whose states are built on demand.

A flat regex copies every sub-pattern once per context it can appear in: the value of an optional member is
spelled once "after the first member" and once "after a comma", and a nested object multiplies that per level, so
a schema whose documents are small can unroll into millions of DFA states. Here a big sub-pattern is written once,
as a rule, and its uses *call* it (a recursive transition network, like the per-rule automata of xgrammar or
llguidance):

    rule text  ... \\x02 D D D ...     a call: the mark byte 0x02, then the callee's number in three digit bytes
                                        (0x0E..0x1F); JSON text never holds raw control bytes, so no document
                                        byte can be mistaken for a call
    grammar    GRAMMAR_PREFIX + root + "\\x00" + rule 1 + "\\x00" + rule 2 ...   (one string: cache keys, errors)

Each rule is compiled by outlines-core (`build_byte_dfa`, anchored). The grammar's own automaton is the subset
construction over call stacks, done lazily: a state is a set of configurations, each a stack of (rule, state)
pairs (the callers' return states below, the current position on top); a byte moves every configuration of the
set's closure (calls entered, finished rules returned from) along its top rule's edge. A state's row is built
when a walk first needs it (`ensure`), which is what keeps the compile in milliseconds.

The automaton looks like a `ByteDFA` to the token walk, with two differences: the dead state is 0 and the
initial state 1 (a row not built yet reads as all-dead, so a missed `ensure` can only forbid, never allow), and
the arrays have a fixed capacity (zero-filled by the OS on first touch); a generation that needs more states
raises `SchemaTooComplexError`.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np

from hf_paged.errors import SchemaTooComplexError
from hf_paged.processors.byte_dfa import build_byte_dfa, byte_sets

__all__ = ["GRAMMAR_PREFIX", "GrammarDFA", "call_regex", "inline_grammar", "join_grammar", "split_grammar"]

GRAMMAR_PREFIX = "\x00grammar\x00"
_SEPARATOR = "\x00"
MARK = 0x02
_DIGITS = list(range(0x0E, 0x20))  # 18 digit bytes
_WIDTH = 3
MAX_RULES = len(_DIGITS) ** _WIDTH
MAX_DEPTH = 128  # calls nested deeper are not entered (a subset: sound; a document that deep may find no way out)
CAPACITY = 1 << 18  # states a grammar automaton may build (rows are 1 KB each, allocated on first touch)


def call_regex(rule: int) -> str:
    """The regex text of a call to rule number `rule` (1 .. MAX_RULES - 1)."""
    if not 0 < rule < MAX_RULES:
        raise ValueError(f"rule number {rule} out of range 1..{MAX_RULES - 1}")
    digits = []
    for _ in range(_WIDTH):
        rule, digit = divmod(rule, len(_DIGITS))
        digits.append(_DIGITS[digit])
    return "\\x02" + "".join(f"\\x{d:02x}" for d in reversed(digits))


def join_grammar(root: str, rules: list[str]) -> str:
    """One string naming the grammar (root regex, then rule 1, 2, ...)."""
    return GRAMMAR_PREFIX + _SEPARATOR.join([root, *rules])


def split_grammar(text: str) -> list[str] | None:
    """[root, rule 1, ...] of a grammar string, or None for a plain regex."""
    if not text.startswith(GRAMMAR_PREFIX):
        return None
    return text[len(GRAMMAR_PREFIX):].split(_SEPARATOR)


def inline_grammar(text: str) -> str:
    """The flat regex of a grammar (every call replaced by its rule's text); for tests and small grammars.

    Raises:
        ValueError: the grammar is recursive (no flat regex).
    """
    parts = split_grammar(text)
    if parts is None:
        return text
    flat: dict[int, str] = {}
    open_rules: set[int] = set()

    def expand(rule: int) -> str:
        if rule in open_rules:
            raise ValueError(f"rule {rule} calls itself: a recursive grammar has no flat regex")
        if rule not in flat:
            open_rules.add(rule)
            body = parts[rule]
            for callee in range(len(parts) - 1, 0, -1):  # longest numbers first is moot: all are 3 digits
                marker = call_regex(callee)
                if marker in body:
                    body = body.replace(marker, f"(?:{expand(callee)})")
            flat[rule] = body
            open_rules.discard(rule)
        return flat[rule]

    return expand(0)


@dataclass(slots=True)
class _Rule:
    """One rule's automaton, its call edges taken out."""

    table: np.ndarray  # int32 [S + 1, 256]; the mark byte's column is dead
    dead: int
    initial: int
    finals: list[bool]
    calls: dict[int, list[tuple[int, int]]]  # state -> [(callee rule, state to return to)]


def _rule(text: str) -> _Rule:
    from hf_paged.processors.index_cache import anchored

    dfa = build_byte_dfa(anchored(text))
    table, dead = dfa.transitions.copy(), dfa.dead
    calls: dict[int, list[tuple[int, int]]] = {}
    for state in np.flatnonzero(table[:-1, MARK] != dead).tolist():
        paths = [(int(table[state, MARK]), 0)]  # (automaton state, digits read as a number)
        for _ in range(_WIDTH):
            paths = [(int(table[at, d]), number * len(_DIGITS) + i)
                     for at, number in paths for i, d in enumerate(_DIGITS) if table[at, d] != dead]
        calls[state] = [(number, at) for at, number in paths]
    table[:, MARK] = dead
    return _Rule(table, dead, dfa.initial, dfa.finals.tolist(), calls)


class GrammarDFA:
    """The byte automaton of a grammar string (`join_grammar`), rows built on demand.

    Args:
        text: the grammar string.
        capacity: most states built (then `SchemaTooComplexError`).

    Raises:
        ValueError: a rule does not compile (outlines-core's error), or calls a rule that does not exist.
    """

    lazy = True
    initial = 1
    dead = 0

    def __init__(self, text: str, capacity: int = CAPACITY):
        parts = split_grammar(text)
        if parts is None:
            raise ValueError("not a grammar string (see join_grammar)")
        self.rules = [_rule(part) for part in parts]
        for number, rule in enumerate(self.rules):
            for targets in rule.calls.values():
                for callee, _ in targets:
                    if not 0 < callee < len(self.rules):
                        raise ValueError(f"rule {number} calls rule {callee}, which the grammar does not have")
        self.capacity = capacity
        self.transitions = np.zeros((capacity, 256), dtype=np.int32)  # zero-filled pages: touched on first write
        self.finals = np.zeros(capacity, dtype=bool)
        self.loops = np.zeros((capacity, 4), dtype=np.uint64)
        self.has_loops = np.zeros(capacity, dtype=bool)
        self.known = np.zeros(capacity, dtype=bool)  # row built
        self.known[0] = True  # dead: all zeros, loops on itself (never walked)
        self._sets: list[frozenset] = [frozenset()]
        self._ids: dict[frozenset, int] = {frozenset(): 0}
        self._closures: dict[tuple, list[tuple]] = {}
        self._lock = threading.RLock()
        root = self.rules[0]
        if self._intern(frozenset({(0, root.initial)})) != self.initial:
            raise AssertionError("the initial state is state 1")

    @property
    def num_states(self) -> int:
        """States the arrays have room for, the dead one excluded (`ByteDFA.num_states`'s meaning for sizing)."""
        return self.capacity - 1

    @property
    def num_built(self) -> int:
        """States named so far (dead included); their rows are built on first `ensure`."""
        return len(self._sets)

    def accepts(self, data: bytes) -> bool:
        """Whether the grammar matches all of `data` (tests and benchmarks; the processors walk tokens)."""
        state = self.initial
        for byte in data:
            self.ensure_one(state)
            state = int(self.transitions[state, byte])
            if state == self.dead:
                return False
        return bool(self.finals[state])

    def ensure_one(self, state: int) -> None:
        """Build the row of `state` if it is not built yet."""
        if not self.known[state]:
            with self._lock:
                if not self.known[state]:
                    self._expand(state)

    def ensure(self, states: np.ndarray) -> None:
        """Build the rows of `states` (any int array) not built yet."""
        missing = states[~self.known[states]]
        if missing.shape[0]:
            with self._lock:
                for state in np.unique(missing).tolist():
                    if not self.known[state]:
                        self._expand(state)

    # -- construction --------------------------------------------------------------------------------------
    def _closure(self, config: tuple) -> list[tuple]:
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
                    moves.append(current[:-1] + (back, callee, rules[callee].initial))
            if len(current) > 2 and rules[rule].finals[state]:
                moves.append(current[:-2])  # the caller's top is its return state already
            for move in moves:
                if move not in seen:
                    seen.add(move)
                    order.append(move)
                    pending.append(move)
        self._closures[config] = order
        return order

    def _intern(self, configs: frozenset) -> int:
        state = self._ids.get(configs)
        if state is not None:
            return state
        state = len(self._sets)
        if state >= self.capacity:
            raise SchemaTooComplexError(
                f"the schema's grammar automaton needs more than {self.capacity:,} states for this generation; "
                "simplify the schema (fewer optional members or alternatives) or shorten the output"
            )
        self._sets.append(configs)
        self._ids[configs] = state
        root = self.rules[0]
        self.finals[state] = any(len(c) == 2 and root.finals[c[1]] for config in configs for c in self._closure(config))
        return state

    def _expand(self, state: int) -> None:
        """Build the row of `state`: per byte, the set of configurations its closure moves to."""
        rules = self.rules
        configs = [c for config in self._sets[state] for c in self._closure(config)]
        moving = []  # (configuration, its top rule's row) for the configurations with a live byte
        for config in dict.fromkeys(configs):
            rule = rules[config[-2]]
            row = rule.table[config[-1]]
            if (row != rule.dead).any():
                moving.append((config, row, rule.dead))
        if not moving:
            row = np.zeros(256, dtype=np.int32)
        elif len(moving) == 1:  # the usual case: one configuration, a handful of distinct next states
            config, targets, dead = moving[0]
            values, inverse = np.unique(targets, return_inverse=True)
            ids = [0 if t == dead else self._intern(frozenset({config[:-1] + (t,)})) for t in values.tolist()]
            row = np.asarray(ids, dtype=np.int32)[inverse]
        else:
            stacked = np.stack([np.where(t == d, -1, t) for _, t, d in moving])  # [configs, 256], -1: dead
            columns, inverse = np.unique(stacked, axis=1, return_inverse=True)
            ids = []
            for column in columns.T.tolist():
                nexts = frozenset(c[:-1] + (t,) for (c, _, _), t in zip(moving, column) if t >= 0)
                ids.append(self._intern(nexts) if nexts else 0)
            row = np.asarray(ids, dtype=np.int32)[inverse.reshape(-1)]
        self.transitions[state] = row
        loops = byte_sets((row == state)[None, :])[0]
        self.loops[state] = loops
        self.has_loops[state] = bool(loops.any())
        self.known[state] = True
