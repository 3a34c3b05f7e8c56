"""Left recursion and dead rules of a Lark grammar, before it becomes a grammar of calls (`automaton.grammar`).

The grammar automaton (`grammar_dfa`) enters a rule's calls without reading a byte, so a rule that can call itself
before reading anything (left recursion) would stack calls forever. Direct left recursion is rewritten, the
language unchanged:

    expr: expr "+" term | expr "-" term | term      ->      expr: term ("+" term | "-" term)*

Left recursion that remains (through other rules, after a part that may be empty, or inside a group) is refused
with `LeftRecursionError` naming the rules of the cycle. A rule that can never finish (every alternative calls it
again) is refused with `UnsatisfiableSchemaError`: a generation that entered it could never end.
"""

from __future__ import annotations

from collections.abc import Callable

from hf_paged.errors import LeftRecursionError, UnsatisfiableSchemaError
from hf_paged.processors.automaton.call_graph import strongly_connected
from hf_paged.processors.lark.syntax import Alt, Node, Ref, Rep, Rx, Seq

__all__ = ["check_rules", "rewrite_left_recursion", "rule_refs", "strongly_connected"]


def _one(items: list[Node]) -> Node:
    return items[0] if len(items) == 1 else Alt(tuple(items))


def rewrite_left_recursion(name: str, body: Node) -> Node | None:
    """`body` with direct left recursion (alternatives that start with `name`) rewritten as a repetition, or None
    when it has none.

    Raises:
        LeftRecursionError: every alternative starts with `name` (no base case).
    """
    alternatives = body.items if isinstance(body, Alt) else (body,)
    tails: list[Node] = []
    bases: list[Node] = []
    for alternative in alternatives:
        items = alternative.items if isinstance(alternative, Seq) else (alternative,)
        if items and isinstance(items[0], Ref) and items[0].name == name:
            if len(items) > 1:  # (`name: name` alone adds nothing to the language)
                tails.append(items[1] if len(items) == 2 else Seq(items[1:]))
        else:
            bases.append(alternative)
    if len(bases) == len(alternatives):
        return None
    if not bases:
        raise LeftRecursionError(
            f"every alternative of rule {name!r} starts with {name!r}, so it derives no finite text; add a base "
            f"alternative (e.g. `{name}: {name} \"+\" term | term`)")
    if not tails:
        return _one(bases)
    return Seq((_one(bases), Rep(_one(tails), 0, None)))


def rule_refs(node: Node, is_rule: Callable[[str], bool]) -> set[str]:
    """The rules `node` refers to, anywhere."""
    out: set[str] = set()
    stack = [node]
    while stack:
        current = stack.pop()
        if isinstance(current, Ref) and is_rule(current.name):
            out.add(current.name)
        elif isinstance(current, (Seq, Alt)):
            stack.extend(current.items)
        elif isinstance(current, Rep):
            stack.append(current.item)
    return out


class _Analysis:
    """Nullable and productive rules (fixpoints), and what each rule calls before reading anything."""

    def __init__(self, bodies: dict[str, Node], terminal_nullable: Callable[[Ref | Rx], bool]) -> None:
        self.bodies = bodies
        self.terminal_nullable = terminal_nullable
        self.nullable = self._fixpoint(self._nullable)
        self.productive = self._fixpoint(self._productive)

    def _fixpoint(self, test: Callable[[Node, dict[str, bool]], bool]) -> dict[str, bool]:
        known = dict.fromkeys(self.bodies, False)
        changed = True
        while changed:
            changed = False
            for name, body in self.bodies.items():
                if not known[name] and test(body, known):
                    known[name] = changed = True
        return known

    def _nullable(self, node: Node, known: dict[str, bool]) -> bool:
        if isinstance(node, Ref):
            return known[node.name] if node.name in self.bodies else self.terminal_nullable(node)
        if isinstance(node, Rx):
            return self.terminal_nullable(node)
        if isinstance(node, Seq):
            return all(self._nullable(item, known) for item in node.items)
        if isinstance(node, Alt):
            return any(self._nullable(item, known) for item in node.items)
        if isinstance(node, Rep):
            return node.lo == 0 or self._nullable(node.item, known)
        return False  # literals (never empty) and ranges

    def _productive(self, node: Node, known: dict[str, bool]) -> bool:
        if isinstance(node, Ref):
            return known[node.name] if node.name in self.bodies else True
        if isinstance(node, Seq):
            return all(self._productive(item, known) for item in node.items)
        if isinstance(node, Alt):
            return any(self._productive(item, known) for item in node.items)
        if isinstance(node, Rep):
            return node.lo == 0 or self._productive(node.item, known)
        return True

    def left_calls(self, node: Node) -> set[str]:
        """The rules `node` may call before reading a character."""
        if isinstance(node, Ref):
            return {node.name} if node.name in self.bodies else set()
        if isinstance(node, Seq):
            out: set[str] = set()
            for item in node.items:
                out |= self.left_calls(item)
                if not self._nullable(item, self.nullable):
                    break
            return out
        if isinstance(node, Alt):
            return set().union(*(self.left_calls(item) for item in node.items))
        if isinstance(node, Rep):
            return self.left_calls(node.item)
        return set()


def check_rules(bodies: dict[str, Node], terminal_nullable: Callable[[Ref | Rx], bool]) -> None:
    """Refuse what the call-stack automaton cannot run: left recursion left after `rewrite_left_recursion`, and
    rules that never finish.

    Raises:
        LeftRecursionError: rules that call each other (or themselves) before reading a character.
        UnsatisfiableSchemaError: a rule every alternative of which calls it again (no finite text).
    """
    analysis = _Analysis(bodies, terminal_nullable)
    dead = sorted(name for name, ok in analysis.productive.items() if not ok)
    if dead:
        raise UnsatisfiableSchemaError(
            f"the rules {', '.join(dead)} derive no finite text (each alternative needs the rule again); give each "
            "an alternative that ends, or remove it")
    graph = {name: analysis.left_calls(body) for name, body in bodies.items()}
    for component in strongly_connected(graph):
        if len(component) > 1 or component[0] in graph[component[0]]:
            cycle = " -> ".join([*component, component[0]])
            raise LeftRecursionError(
                f"left recursion through the rules {cycle}: each can call the next before reading any text, which "
                "a call-stack automaton cannot run; only direct left recursion at the start of an alternative "
                "(`expr: expr \"+\" term | term`) is rewritten: rewrite the others as repetitions "
                "(`a: b (\"x\" b)*`)")
