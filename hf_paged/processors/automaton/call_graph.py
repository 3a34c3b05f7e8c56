"""Who calls whom in a grammar (`grammar.Grammar`), read off the rule texts once per grammar (`call_graph`,
memoised): `grammar_rules` checks with it that every callee exists (before any table is written), and
`productive` looks in it for call cycles.

    texts --one scan for `call_regex`'s markers--> CallGraph(callees per rule, whether every mark is a call)
          --components--> strongly connected components, callees' first (Tarjan)
"""

from __future__ import annotations

import re
import threading
from collections import OrderedDict
from collections.abc import Hashable, Iterable, Mapping
from dataclasses import dataclass

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.processors.automaton.grammar import DIGITS, Grammar

__all__ = ["CallGraph", "call_graph", "call_number", "components", "strongly_connected"]

_MARKER = re.compile(r"\\x02((?:\\x[0-9a-f]{2}){3})")  # a call as `call_regex` spells it: the digits


@dataclass(frozen=True, slots=True)
class CallGraph:
    """The calls of a grammar's rules, as their texts spell them."""

    callees: tuple[frozenset[int], ...]  # rule n's callees (numbers as spelled: possibly past the grammar's rules)
    spelled: tuple[bool, ...]  # rule n's every mark byte starts a call whose digits are digit bytes (else its
    #                            automaton's call edges are the truth: `grammar_rules` reads them)


def call_number(digits: str) -> int | None:
    """The rule number of a call's three digits as `call_regex` writes them (`\\x0e\\x0e\\x0f`), or None when a
    digit is not a digit byte. Memoised (a grammar repeats its calls)."""
    number = _NUMBERS.get(digits)
    if number is None:
        number = 0
        for at in (2, 6, 10):
            digit = int(digits[at : at + 2], 16) - DIGITS[0]
            if not 0 <= digit < len(DIGITS):
                return None
            number = number * len(DIGITS) + digit
        _NUMBERS[digits] = number  # (at most MAX_RULES entries: only digit bytes get here)
    return number


def _scan(text: str) -> tuple[frozenset[int], bool]:
    if "\\x02" not in text:  # (most texts: no call at all, a scan in C)
        return _NO_CALLS, True
    markers = _MARKER.findall(text)
    numbers = {call_number(digits) for digits in set(markers)}
    spelled = None not in numbers and text.count("\\x02") == len(markers)
    numbers.discard(None)
    return frozenset(numbers), spelled  # type: ignore[arg-type]


def call_graph(grammar: Grammar) -> CallGraph:
    """The calls of `grammar`'s rules, memoised per grammar (the ladder's check and the build share one scan)."""
    with _LOCK:
        hit = _GRAPHS.get(grammar)
        if hit is not None:
            _GRAPHS.move_to_end(grammar)
            return hit
    scans = [_scan(text) for text in grammar.texts]
    graph = CallGraph(tuple(callees for callees, _ in scans), tuple(spelled for _, spelled in scans))
    with _LOCK:
        _GRAPHS[grammar] = graph
        while len(_GRAPHS) > _GRAPHS_SIZE:
            _GRAPHS.popitem(last=False)
    return graph


def components(graph: CallGraph) -> list[list[int]]:
    """The strongly connected components of the call graph, callees' before their callers' (Tarjan's order); a rule
    that calls nothing (or only missing rules) is left out."""
    callees = graph.callees
    return strongly_connected({rule: [c for c in calls if 0 <= c < len(callees) and callees[c]]
                               for rule, calls in enumerate(callees) if calls})


def strongly_connected(graph: Mapping[Hashable, Iterable[Hashable]]) -> list[list]:
    """Tarjan's strongly connected components of `graph` (every edge's target a key), iteratively, callees' before
    their callers'; each component in the order its members were met. Edges are followed in sorted order."""
    index: dict = {}
    low: dict = {}
    on_stack: set = set()
    stack: list = []
    out: list[list] = []
    for root, edges_of_root in graph.items():
        if root in index:
            continue
        work = [(root, iter(sorted(edges_of_root)))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            advanced = False
            for nxt in edges:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                    advanced = True
                    break
                if nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                out.append(component[::-1])
    return out


_NO_CALLS: frozenset[int] = frozenset()
_NUMBERS: dict[str, int] = {}  # a call's digits -> its rule number
_GRAPHS: OrderedDict[Grammar, CallGraph] = OrderedDict()
_GRAPHS_SIZE = 16
_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)
