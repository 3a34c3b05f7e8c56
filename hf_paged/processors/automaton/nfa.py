"""A regex tree (`syntax.Node`) -> a Thompson NFA over bytes, every position counted against the budget.

Built backwards, each node compiled in front of its continuation, so sequences need no patching:

    SPARSE  [(lo, hi, next), ...]   read one byte in [lo, hi]       (a UTF-8 sequence is a chain of these)
    SPLIT   [next, ...]             epsilon to each                 (alternation, repetition)
    LOOK    (START | END, next)     epsilon at the start / end of the text only
    MATCH                           the whole text matched

A counted repetition `x{m,n}` is n copies of x (the automaton cannot count otherwise): the budget's
`nfa_states` bounds what such copies cost before any determinization starts.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field

from hf_paged.processors.automaton.charsets import Ranges, utf8_sequences
from hf_paged.processors.automaton.tree import Node
from hf_paged.processors.budget import CompileBudget

__all__ = ["LOOK", "MATCH", "MIN_TRIE", "NFA", "SPARSE", "SPEND_EVERY", "SPLIT", "build_nfa"]

SPARSE, SPLIT, LOOK, MATCH = 0, 1, 2, 3
SPEND_EVERY = 4096  # positions counted locally, then spent from the budget in one call


@dataclass(slots=True)
class NFA:
    """States 0..n-1: `kinds[i]` and `edges[i]` (see the module docstring); `start` is where matching begins."""

    kinds: list[int] = field(default_factory=list)
    edges: list = field(default_factory=list)
    start: int = 0


class _Builder:
    def __init__(self, budget: CompileBudget):
        self.nfa = NFA()
        self.budget = budget
        self.unspent = 0
        self.chains: dict[tuple[int, int, int], int] = {}  # (lo, hi, next) -> its one-range state: shared suffixes
        self.sets: dict[tuple[Ranges, int], int] = {}  # (code point ranges, next) -> the class's first state

    def add(self, kind: int, edges) -> int:
        self.nfa.kinds.append(kind)
        self.nfa.edges.append(edges)
        self.unspent += 1
        if self.unspent >= SPEND_EVERY:
            self.flush()
        return len(self.nfa.kinds) - 1

    def flush(self) -> None:
        self.budget.spend("nfa_states", self.unspent)
        self.unspent = 0

    def split(self, targets: list[int]) -> int:
        return targets[0] if len(targets) == 1 else self.add(SPLIT, targets)

    def char_set(self, ranges: Ranges, nxt: int) -> int:
        """One code point of `ranges`, as its UTF-8 byte sequences, then `nxt`."""
        key = (ranges, nxt)
        state = self.sets.get(key)
        if state is None and len(ranges) == 1 and ranges[0][1] < 0x80:  # one ASCII range (most characters): one
            nfa = self.nfa  # byte range, `add` inlined (what the general path below builds for it)
            nfa.kinds.append(SPARSE)
            nfa.edges.append([(ranges[0][0], ranges[0][1], nxt)])
            self.unspent += 1
            if self.unspent >= SPEND_EVERY:
                self.flush()
            state = self.sets[key] = len(nfa.kinds) - 1
        elif state is None:
            first = []
            for sequence in utf8_sequences(ranges):
                after = nxt
                for lo, hi in reversed(sequence[1:]):
                    chain = (lo, hi, after)
                    shared = self.chains.get(chain)
                    if shared is None:
                        shared = self.chains[chain] = self.add(SPARSE, [chain])
                    after = shared
                first.append((sequence[0][0], sequence[0][1], after))
            state = self.sets[key] = self.add(SPARSE, first)
        return state

    def compile(self, node: Node, nxt: int) -> int:
        """The first state of `node` followed by `nxt`. An explicit stack of generators (one per open group), not
        Python recursion: a pattern nested 500 groups deep compiles like a flat one, whatever the caller's stack."""
        if node.kind == "set":
            return self.char_set(node.ranges, nxt)
        stack = [self._steps(node, nxt)]
        value: int | None = None
        while stack:
            try:
                child, child_nxt = stack[-1].send(value)
            except StopIteration as done:
                stack.pop()
                value = done.value
                continue
            while child.kind == "seq" and len(child.children) == 1:  # a group around one item: `(?:[ ]?)`
                child = child.children[0]
            if child.kind == "set":  # (the most common child: no generator for it)
                value = self.char_set(child.ranges, child_nxt)
            elif child.kind == "rep" and child.children[0].kind == "set":  # `[ ]?`, `x*`, `[0-9a-f]{2}`
                value = self.repeat_set(child.children[0].ranges, child.lo, child.hi, child_nxt)
            else:
                stack.append(self._steps(child, child_nxt))
                value = None
        assert value is not None
        return value

    def repeat_set(self, ranges: Ranges, lo: int, hi: int | None, nxt: int) -> int:
        """`x{lo,hi}` of one character class without a generator: the states `_steps` builds for it, in the same
        order (a class always adds a position, so none of its early returns applies)."""
        if hi == 0:
            return nxt
        if hi is None:
            loop = self.add(SPLIT, None)
            body = self.char_set(ranges, loop)
            self.nfa.edges[loop] = [body, nxt]
            current, copies = (body, lo - 1) if lo >= 1 else (loop, 0)
        else:
            current = self.char_set(ranges, nxt)
            if hi > lo:
                current = self.split([current, nxt])
                for _ in range(hi - lo - 1):
                    current = self.split([self.char_set(ranges, current), nxt])
                copies = lo
            else:
                copies = lo - 1
        for _ in range(copies):
            current = self.char_set(ranges, current)
        return current

    def _steps(self, node: Node, nxt: int) -> Generator[tuple[Node, int], int, int]:
        """Compile `node` in front of `nxt`, yielding (child, continuation) for every child to compile first."""
        kind = node.kind
        if kind == "set":
            return self.char_set(node.ranges, nxt)
        if kind == "seq":
            for child in reversed(node.children):
                nxt = self.char_set(child.ranges, nxt) if child.kind == "set" else (yield child, nxt)
            return nxt
        if kind == "alt":
            literals = _literals(node.children)
            if literals is not None:
                return self.literal_trie(literals, nxt)
            targets = []
            for child in node.children:
                targets.append(self.char_set(child.ranges, nxt) if child.kind == "set" else (yield child, nxt))
            return self.split(targets)
        if kind == "look":
            return self.add(LOOK, (node.lo, nxt))
        child, lo, hi = node.children[0], node.lo, node.hi
        if hi == 0:
            return nxt
        if hi is None:  # x{lo,}: lo - 1 copies, then x+ (one copy looping back through a split)
            loop = self.add(SPLIT, None)
            body = yield child, loop
            if body == loop:  # a child that adds no position matches only "": so does its repetition
                self.nfa.edges[loop] = [nxt]
                return nxt
            self.nfa.edges[loop] = [body, nxt]
            current, copies = (body, lo - 1) if lo >= 1 else (loop, 0)
        else:  # x{lo,hi}: lo copies, then hi - lo optional ones, each free to stop
            current = yield child, nxt  # the last copy
            if current == nxt:
                return nxt
            if hi > lo:
                current = self.split([current, nxt])
                for _ in range(hi - lo - 1):
                    current = self.split([(yield child, current), nxt])
                copies = lo
            else:
                copies = lo - 1
        for _ in range(copies):
            current = yield child, current
        return current

    def literal_trie(self, literals: list[tuple[int, ...]], nxt: int) -> int:
        """An alternation of literal strings (an enum, a list of keys) as a trie: shared prefixes share their
        states, and each state reads its next characters on one set of byte edges, so determinizing it is a
        walk, not a subset construction over every alternative at once. Built bottom-up without recursion."""
        trie: dict = {}
        for text in literals:
            node = trie
            for cp in text:
                node = node.setdefault(cp, {})
            node[None] = None  # a literal ends here
        first: dict[int, int] = {}  # id(trie node) -> its state
        stack: list[tuple[dict, bool]] = [(trie, False)]
        while stack:
            node, children_done = stack.pop()
            if not children_done:
                stack.append((node, True))
                stack.extend((child, False) for cp, child in node.items() if cp is not None)
                continue
            edges, targets = [], []
            for cp, child in node.items():
                if cp is None:
                    continue
                if cp < 0x80:
                    edges.append((cp, cp, first[id(child)]))
                else:
                    targets.append(self.char_set(((cp, cp),), first[id(child)]))
            if edges:
                edges.sort()
                targets.insert(0, self.add(SPARSE, edges))
            if None in node:
                targets.append(nxt)
            first[id(node)] = self.split(targets)
        return first[id(trie)]


MIN_TRIE = 3  # alternatives from which a literal alternation is built as a trie


def _literals(children: tuple[Node, ...]) -> list[tuple[int, ...]] | None:
    """The code points of each alternative when every one is a literal string (else None)."""
    if len(children) < MIN_TRIE:
        return None
    out = []
    for child in children:
        if child.kind == "set":
            parts: tuple[Node, ...] = (child,)
        elif child.kind == "seq":
            parts = child.children
        else:
            return None
        text = []
        for part in parts:
            ranges = part.ranges
            if part.kind != "set" or len(ranges) != 1 or ranges[0][0] != ranges[0][1]:
                return None
            text.append(ranges[0][0])
        out.append(tuple(text))
    return out


def build_nfa(node: Node, budget: CompileBudget) -> NFA:
    """The NFA of `node` (whole-text match).

    Raises:
        SchemaTooComplexError: more positions than the budget's `max_nfa_states`.
    """
    builder = _Builder(budget)
    match = builder.add(MATCH, None)
    builder.nfa.start = builder.compile(node, match)
    builder.flush()
    return builder.nfa
