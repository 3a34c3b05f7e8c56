"""The byte automaton of a grammar (`grammar.Grammar`), its states named and their rows built on demand.

Each rule is a byte automaton of its own (`grammar_rules`), its call edges read off and cut out. The grammar's
automaton is the subset construction over call stacks, done lazily. A configuration is a stack of
(rule, state) pairs, the callers' return states below and the current position on top; an automaton state is a
set of configurations, and a byte moves every configuration of the set's closure (calls entered, finished rules
returned from) along its top rule's edge. Most states hold one configuration, and most of those sit inside a rule,
away from its calls and ends: their row is the rule's own row, renamed. So:

    context   (the stack below, rule): a table rule state -> automaton state, filled as states are reached
    inside    one configuration, no call here, not a finished callee: row = context ids[rule row] (one gather)
    boundary  any other state: rows from the closure, byte by byte (calls, returns, several configurations;
              `grammar_stacks.CallStacks` steps the configurations, this names the sets they reach)

A row is built when a walk first needs it (`ensure`, `ensure_path` for a string body's run of states), which
keeps the compile in milliseconds whatever the size of the flat automaton.

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
from hf_paged.processors.automaton.grammar import Grammar
from hf_paged.processors.automaton.grammar_depth import NestingLimit
from hf_paged.processors.automaton.grammar_rules import Rule, grammar_rules
from hf_paged.processors.automaton.grammar_stacks import MAX_DEPTH, CallStacks
from hf_paged.processors.automaton.lazy_zeros import lazy_zeros_many
from hf_paged.processors.automaton.utf8 import multibyte_ends
from hf_paged.processors.budget import CompileBudget

__all__ = ["CAPACITY", "MAX_DEPTH", "GrammarDFA", "InsideView"]

CAPACITY = 1 << 20  # states a grammar automaton may name (a row is 1 KB, allocated when first written)
# configurations one state's row may step (its members' closures): an ambiguous grammar's parses of the text so far
# multiply (~2x a byte: 17k configurations, 5 s for one row, after 19 bytes of one); the test grammars stay under 10
MAX_CONFIGURATIONS = 1024
ROOT_ROWS = 1 << 15  # a root rule up to this many states has its rows built at once (`build_root_rows`)
CONTEXT_ROWS = 256  # a called rule up to this many states has its rows built when its context is first met
MAX_VIEWS = 1 << 17  # memoised `inside_view`s (~200 bytes each), then cleared


@dataclass(slots=True)
class InsideView:
    """A state inside a rule (or a whole context, `context_view`): automaton state = base + rule state, with the
    rule's row renamed."""

    base: int  # its context's first state
    rule: int
    called: bool  # under callers (a finished rule state is then a stop: it returns)
    rule_state: int  # (-1 for a whole context)
    inside: np.ndarray  # bool per rule state: not a stop (no call, not a finished callee)


@dataclass(slots=True)
class _Context:
    """The states of one rule under one stack of callers: automaton states base + rule state."""

    prefix: tuple  # the callers: (rule, return state) pairs, flattened, outermost first
    rule: int
    base: int


class GrammarDFA:
    """The byte automaton of a `Grammar`, rows built on demand.

    Args:
        grammar: the grammar (root and rules).
        capacity: most states named (then `SchemaTooComplexError`).
        max_configurations: most call-stack configurations one state's row steps (then `SchemaTooComplexError`).
        budget: the work budget of the rules' automata (see `grammar_rules`).

    Raises:
        InvalidRegexError, SchemaTooComplexError, UnsatisfiableSchemaError: see `grammar_rules`.
    """

    lazy = True
    initial = 1
    dead = 0

    def __init__(self, grammar: Grammar, capacity: int = CAPACITY, budget: CompileBudget | None = None,
                 max_configurations: int = MAX_CONFIGURATIONS):
        self.grammar = grammar
        self.rules = list(grammar_rules(grammar, budget))  # (its own list: pruned copies join it, `NestingLimit`)
        self.limit = NestingLimit(self.rules, grammar)
        self.capacity = capacity
        self.max_configurations = max_configurations
        # zero-filled arrays: the OS hands out their pages on first write, so capacity costs address space only
        # (on one mapping: `lazy_zeros_many`)
        (self.transitions, self.finals, self.loops, self.has_loops, self.known, self._state_context,
         self._rule_state) = lazy_zeros_many(((capacity, 256), np.int32), (capacity, np.bool_),
                                             ((capacity, 4), np.uint64), (capacity, np.bool_), (capacity, np.bool_),
                                             (capacity, np.int32), (capacity, np.int32))
        # known: row built; _state_context: one configuration's context + 1, else 0; _rule_state: its rule state
        self.known[0] = True  # dead: all zeros, loops on itself (never walked)
        self._num_named = 1
        self._contexts: list[_Context] = []
        self._context_ids: dict[tuple, int] = {}  # prefix + (rule,) -> context
        self._sets: dict[int, frozenset] = {}  # states of several configurations
        self._set_ids: dict[frozenset, int] = {}
        self._stacks = CallStacks(self.rules, self.limit)  # closures and subset steps of configurations
        self._inside_masks: dict[tuple[int, bool], np.ndarray] = {}  # (rule, called) -> `inside_mask`
        self._views: dict[int, InsideView | None] = {}  # state -> `inside_view`
        self._lock = threading.RLock()
        if self._config_state((0, self.rules[0].initial)) != self.initial:
            raise AssertionError("the initial state is state 1")

    def build_root_rows(self) -> None:
        """The root rule's inside rows, in one gather: every document walks it, and its key states fan out over many
        rows that a walk would otherwise build a level at a time. Ahead of decoding, off the compile's path (a third
        of a median schema's index time): `TokenIndex.warm` runs it in the background; walks build on demand the
        rows it has not built yet (the same rows either way)."""
        size = self.rules[0].table.shape[0] - 1
        if size > ROOT_ROWS:
            return
        with self._lock:
            root = self._contexts[0]
            every = np.arange(size, dtype=np.int64)
            every = every[~self._boundaries(root, self.rules[0], every) & ~self.known[root.base + every]]
            if every.shape[0]:
                self._inside_rows(root, self.rules[0], every)

    @property
    def num_states(self) -> int:
        """States the arrays have room for, the dead one excluded (`ByteDFA.num_states`'s meaning for sizing)."""
        return self.capacity - 1

    @property
    def num_built(self) -> int:
        """States named so far (dead included); their rows are built on first `ensure`."""
        return self._num_named

    def accepts(self, data: bytes) -> bool:
        """Whether the grammar matches all of `data` (tests and benchmarks; the processors walk tokens)."""
        state = self.initial
        for byte in data:
            self.ensure_one(state)
            state = int(self.transitions[state, byte])
            if state == self.dead:
                return False
        self.ensure_one(state)
        return bool(self.finals[state])

    def ensure_one(self, state: int) -> None:
        """Build the row (and finality) of `state` if it is not built yet."""
        if not self.known[state]:
            with self._lock:
                if not self.known[state]:
                    self._expand(state)

    def ensure(self, states: np.ndarray) -> None:
        """Build the rows of `states` (any int array) not built yet: inside states one gather per context."""
        missing = states[~self.known[states]]
        if not missing.shape[0]:
            return
        with self._lock:
            missing = np.unique(missing)
            missing = missing[~self.known[missing]]
            contexts = self._state_context[missing]
            for context in np.unique(contexts[contexts > 0]).tolist():
                ctx = self._contexts[context - 1]
                rule = self.rules[ctx.rule]
                rule_states = self._rule_state[missing[contexts == context]].astype(np.int64)
                inside = ~self._boundaries(ctx, rule, rule_states)
                if inside.any():
                    self._inside_rows(ctx, rule, rule_states[inside])
            for state in missing[~self.known[missing]].tolist():  # the others, one by one, from the closure
                self._expand(state)

    def ensure_path(self, state: int, byte: int) -> None:
        """Build the rows along the run of `byte` from `state` (a string body's chain of counted characters)
        while it stays inside one rule, in one gather."""
        context = int(self._state_context[state])
        if not context:
            return
        with self._lock:
            ctx = self._contexts[context - 1]
            rule = self.rules[ctx.rule]
            current, run, seen = int(self._rule_state[state]), [], set()
            while current != rule.dead and current not in seen and not self._boundaries(ctx, rule, current):
                run.append(current)
                seen.add(current)
                current = int(rule.table[current, byte])
            if run:
                run_states = np.asarray(run, dtype=np.int64)
                run_states = run_states[~self.known[ctx.base + run_states]]
                if run_states.shape[0]:
                    self._inside_rows(ctx, rule, run_states)

    def multibyte_ends(self, states: np.ndarray) -> np.ndarray:
        """`utf8.multibyte_ends` of `states`: a state inside a rule takes its rule state's (computed for the
        whole rule at once, then renamed: a character's middle states are inside the rule too); others (rare) are
        walked on their own rows."""
        out = np.full(states.shape[0], -1, dtype=np.int64)
        with self._lock:
            contexts = self._state_context[states]
            odd = contexts == 0
            for context in np.unique(contexts[~odd]).tolist():
                ctx = self._contexts[context - 1]
                rule = self.rules[ctx.rule]
                which = np.flatnonzero(contexts == context)
                rule_states = self._rule_state[states[which]].astype(np.int64)
                if rule.multibyte is None:
                    rule.multibyte = multibyte_ends(rule.table)
                ends = rule.multibyte[rule_states]
                out[which] = np.where(ends < 0, -1, np.where(ends == rule.dead, 0, ctx.base + ends))
                odd[which[self._boundaries(ctx, rule, rule_states)]] = True
            if odd.any():
                self.ensure(states[odd])
                leads = (self.transitions[states, 0xC2:0xF5] != 0).any(axis=1)
                out[odd & ~leads] = 0  # no character of two bytes or more starts here: they all end dead
                if (odd & leads).any():
                    out[odd & leads] = multibyte_ends(self.transitions, states[odd & leads], self.ensure)
        return out

    def inside(self, state: int) -> tuple[int, int, int] | None:
        """(context base, rule, rule state) of a state inside a rule (one configuration, no call, not a finished
        callee: its row is its rule state's, renamed), else None."""
        context = int(self._state_context[state])
        if not context:
            return None
        ctx = self._contexts[context - 1]
        rule_state = int(self._rule_state[state])
        if self._boundaries(ctx, self.rules[ctx.rule], rule_state):
            return None
        return ctx.base, ctx.rule, rule_state

    def frames(self, state: int) -> tuple[tuple[int, int], ...] | None:
        """The call stack of a single-configuration state, outermost first: (rule, return state) per caller, then
        (rule, rule state) (None for a set state or the dead state)."""
        context = int(self._state_context[state])
        if not context:
            return None
        ctx = self._contexts[context - 1]
        config = ctx.prefix + (ctx.rule, int(self._rule_state[state]))
        return tuple(zip(config[::2], config[1::2]))

    def set_members(self, state: int) -> list[int] | None:
        """The single-configuration states of a state of several configurations (None for any other state): a
        token keeps the set alive exactly when it keeps one of them alive (the subset construction), so the set's
        mask is the union of theirs."""
        configs = self._sets.get(state)
        if configs is None:
            return None
        with self._lock:
            return [self._config_state(config) for config in configs]

    def inside_view(self, state: int) -> InsideView | None:
        """Where a state inside a rule sits (None for any other state), memoised (a first visit asks 2-3 times)."""
        view = self._views.get(state, False)
        if view is not False:
            return view
        context = int(self._state_context[state])
        view = None
        if context:
            ctx = self._contexts[context - 1]
            inside = self.inside_mask(ctx.rule, bool(ctx.prefix))
            rule_state = int(self._rule_state[state])
            if inside[rule_state]:
                view = InsideView(ctx.base, ctx.rule, bool(ctx.prefix), rule_state, inside)
        if len(self._views) >= MAX_VIEWS:
            self._views.clear()
        self._views[state] = view
        return view

    def context_view(self, context: int) -> InsideView:
        """A context (`_state_context`'s number, from 1) seen from its rule: a walk may follow the rule's own table
        from every rule state where `inside` holds (state base + rule state has the rule's row, renamed), and must
        come back to the automaton at the others (calls, finished callees). (`rule_state` is -1: no state.)"""
        ctx = self._contexts[context - 1]
        return InsideView(ctx.base, ctx.rule, bool(ctx.prefix), -1, self.inside_mask(ctx.rule, bool(ctx.prefix)))

    def inside_mask(self, rule_index: int, called: bool) -> np.ndarray:
        """bool per rule state: no call there, and (`called`) not a finished callee."""
        inside = self._inside_masks.get((rule_index, called))
        if inside is None:
            rule = self.rules[rule_index]
            inside = rule.has_calls | (rule.finals if called else False)
            inside = self._inside_masks[rule_index, called] = ~inside
        return inside

    # -- naming states -----------------------------------------------------------------------------------
    def _new_states(self, count: int) -> int:
        first = self._num_named
        if first + count > self.capacity:
            raise SchemaTooComplexError(
                f"the schema's grammar automaton needs more than {self.capacity:,} states for this generation; "
                "simplify the schema (fewer optional members or alternatives) or shorten the output"
            )
        self._num_named += count
        return first

    def _context(self, prefix: tuple, rule: int) -> _Context:
        """The context of `rule` under `prefix`: a block of states, one per rule state, named at once (their
        rows come later, on demand)."""
        key = prefix + (rule,)
        context = self._context_ids.get(key)
        if context is not None:
            return self._contexts[context]
        the_rule = self.rules[rule]
        size = the_rule.table.shape[0] - 1  # (the rule's dead state is our dead state, 0)
        base = self._new_states(size)
        ctx = _Context(prefix, rule, base)
        self._context_ids[key] = len(self._contexts)
        self._contexts.append(ctx)
        self._state_context[base:base + size] = len(self._contexts)
        self._rule_state[base:base + size] = np.arange(size, dtype=np.int32)
        if not prefix:  # the root, uncalled: final where the root rule is (a call's state: from its closure)
            self.finals[base:base + size] = the_rule.finals[:size] & ~the_rule.has_calls[:size]
        if size <= CONTEXT_ROWS:  # a small rule: all its inside rows at once (one gather beats a walk's level-by-level)
            every = np.arange(size, dtype=np.int64)
            inside = ~self._boundaries(ctx, the_rule, every)
            self._inside_rows(ctx, the_rule, every[inside])
        return ctx

    def _config_state(self, config: tuple) -> int:
        """The automaton state of one configuration."""
        ctx = self._context(config[:-2], config[-2])
        state = config[-1]
        return 0 if state == self.rules[ctx.rule].dead else ctx.base + state

    def _set_state(self, configs: frozenset) -> int:
        """The automaton state of a set of configurations (0 for none)."""
        if not configs:
            return 0
        if len(configs) == 1:
            return self._config_state(next(iter(configs)))
        state = self._set_ids.get(configs)
        if state is None:
            state = self._new_states(1)
            self._sets[state] = configs
            self._set_ids[configs] = state
            self.finals[state] = any(self._stacks.is_final(config) for config in configs)
        return state

    # -- rows ------------------------------------------------------------------------------------------------
    @staticmethod
    def _boundaries(ctx: _Context, rule: Rule, rule_states: np.ndarray | int) -> np.ndarray:
        """Whether each rule state is a call or a finished callee (its row and finality come from the closure)."""
        return rule.has_calls[rule_states] | (rule.finals[rule_states] if ctx.prefix else False)

    def _inside_rows(self, ctx: _Context, rule: Rule, rule_states: np.ndarray) -> None:
        """Rows of states inside a rule: the rule's rows, moved to the context's block (one gather)."""
        rows = rule.table[rule_states]
        live = rows != rule.dead
        rows += ctx.base
        rows *= live  # (the dead state: 0, in place; big rules move megabytes here)
        states = ctx.base + rule_states
        self.transitions[states] = rows
        self.loops[states] = rule.loops[rule_states]  # (a byte that keeps the rule state keeps the state)
        self.has_loops[states] = rule.has_loops[rule_states]
        self.known[states] = True

    def _expand(self, state: int) -> None:
        """Build the row of `state` (and, for a boundary state, its finality)."""
        context = int(self._state_context[state])
        if context:
            ctx = self._contexts[context - 1]
            rule = self.rules[ctx.rule]
            rule_state = int(self._rule_state[state])
            if not (rule.has_calls[rule_state] or (ctx.prefix and rule.finals[rule_state])):
                # inside: the rule's row moved to the block (the narrow walks build rows one at a time: keep it short)
                row = self.transitions[state]
                np.add(rule.table[rule_state], ctx.base, out=row)
                row[rule.table[rule_state] == rule.dead] = 0
                self.loops[state] = rule.loops[rule_state]
                self.has_loops[state] = rule.has_loops[rule_state]
                self.known[state] = True
                return
            config = ctx.prefix + (ctx.rule, rule_state)
            self.finals[state] = self._stacks.is_final(config)
            configs = self._stacks.closure(config)
        else:
            configs = [c for config in self._sets[state] for c in self._stacks.closure(config)]
        if len(configs) > self.max_configurations:  # (a count of work: the same text fails on any machine)
            raise SchemaTooComplexError(
                f"a state of the grammar automaton holds {len(configs):,} call stacks (limit "
                f"{self.max_configurations:,}): the grammar is ambiguous, its ways to parse the text so far multiply "
                "with every character; write it so that a text parses one way (e.g. no rule that repeats a rule "
                "which may itself be empty or repeat)"
            )
        sets, inverse = self._stacks.step(configs)
        row = np.asarray([self._set_state(found) for found in sets], dtype=np.int32)[inverse]
        self.transitions[state] = row
        member = row == state
        self.loops[state] = np.packbits(member, bitorder="little").view(np.uint64)
        self.has_loops[state] = bool(member.any())
        self.known[state] = True
