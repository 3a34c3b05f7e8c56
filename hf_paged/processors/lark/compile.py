"""A Lark grammar (`lark.syntax.LarkGrammar`) -> the grammar our automaton runs (`automaton.Grammar`).

    terminal (NAME: ..., "lit", /re/)   regex text, expanded inline where it is used (terminals are regular)
    rule in a recursion cycle           a rule of its own; its uses are calls (`call_regex`)
    other rule                          inlined as `(?:text)` while its text is short (fewer calls to walk),
                                        else a rule of its own
    %ignore X                           `(?:X)*` after every terminal of a rule, and at the start of the root
                                        (`(?:X){0,n}` under `max_ignored=n`):
                                        exactly "ignored text may stand before, between and after tokens";
                                        under `max_ignored=n`, an X of whitespace runs (`WS`) is cut to one
                                        character (or `\r\n`) a match, so n bounds the characters too
    start                               the root (rule 0)

A grammar with no call left is a plain regex (a `ByteDFA`, every row built at once). Every text written is
counted against the `CompileBudget` (`text`), so a terminal that doubles at each level is refused, not built.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from functools import lru_cache

from hf_paged.errors import SchemaTooComplexError, UndefinedRuleError, UnsupportedGrammarError
from hf_paged.processors.automaton.grammar import MAX_RULES, Grammar, call_regex
from hf_paged.processors.automaton.syntax import parse as parse_regex
from hf_paged.processors.automaton.tree import Unsupported
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.lark.common import COMMON_SOURCE
from hf_paged.processors.lark.recursion import (
    check_rules,
    rewrite_left_recursion,
    rule_refs,
    strongly_connected,
)
from hf_paged.processors.lark.syntax import (
    Alt,
    CharRange,
    Definition,
    LarkGrammar,
    Lit,
    Node,
    Ref,
    Rep,
    Rx,
    Seq,
    parse_lark,
)
from hf_paged.processors.lark.terminals import literal_regex, python_regex, range_regex

__all__ = ["INLINE_CHARS", "LarkCompiled", "compile_lark"]

INLINE_CHARS = 2_000  # a rule outside recursion is inlined into its callers while its text is at most this long


@dataclass(slots=True, frozen=True)
class LarkCompiled:
    """What a Lark grammar compiles to."""

    constraint: str | Grammar  # the rules that call each other, or a plain regex when no rule needs a call
    rule_names: tuple[str, ...]  # the grammar's rule numbers -> Lark rule names ("" for the root)
    rewritten: tuple[str, ...]  # rules whose direct left recursion was rewritten as a repetition


def _is_rule(name: str) -> bool:
    return name.lstrip("_")[:1].islower()


@lru_cache(maxsize=1)
def _common() -> dict[str, Definition]:
    return parse_lark(COMMON_SOURCE).terminals


class _Terminals:
    """Terminal regex texts of one namespace (the user's, or `common`), memoised, recursion refused."""

    def __init__(self, definitions: dict[str, Definition], budget: CompileBudget, imported: dict[str, str]) -> None:
        self.definitions = definitions
        self.budget = budget
        self.texts = dict(imported)
        self.open: list[str] = []

    def text(self, ref: Ref) -> str:
        name = ref.name
        if name in self.texts:
            return self.texts[name]
        definition = self.definitions.get(name)
        if definition is None:
            raise UndefinedRuleError(_undefined("terminal", ref, [*self.definitions, *self.texts]))
        if name in self.open:
            cycle = " -> ".join([*self.open[self.open.index(name):], name])
            raise UnsupportedGrammarError(
                f"the terminal {name} refers to itself ({cycle}); terminals are regular: make the recursive part a "
                "rule (a lowercase name)")
        self.open.append(name)
        text = self.texts[name] = self.expr(definition.body, f"terminal {name}")
        self.open.pop()
        return text

    def expr(self, node: Node, where: str) -> str:
        """Regex text of a terminal expression (no rules allowed)."""
        if isinstance(node, Ref):
            if _is_rule(node.name):
                raise UnsupportedGrammarError(
                    f"{where} uses the rule {node.name!r} (line {node.line}); terminals may use only terminals: make "
                    f"{where.split()[-1]} a rule (lowercase) or {node.name} a terminal (uppercase)")
            return self.text(node)
        if isinstance(node, Seq):
            text = "".join(f"(?:{self.expr(item, where)})" for item in node.items)
        elif isinstance(node, Alt):
            text = "|".join(self.expr(item, where) for item in node.items)
        elif isinstance(node, Rep):
            text = f"(?:{self.expr(node.item, where)})" + _quantifier(node)
        else:
            text = leaf_regex(node, where)
        self.budget.spend("text", len(text))
        return text


def leaf_regex(node: Node, where: str) -> str:
    """Regex text of a literal, a range or a regex."""
    if isinstance(node, Lit):
        return literal_regex(node.text, node.ci, f"the literal {node.text!r} in {where}")
    if isinstance(node, CharRange):
        return range_regex(node.lo, node.hi, f"the range {node.lo!r}..{node.hi!r} in {where}")
    if isinstance(node, Rx):
        return python_regex(node.pattern, node.flags, f"the regex /{node.pattern}/{node.flags} in {where}")
    raise AssertionError(f"not a leaf: {node!r}")


def _quantifier(node: Rep) -> str:
    if node.hi is None:
        return "*" if node.lo == 0 else "+" if node.lo == 1 else f"{{{node.lo},}}"
    return "?" if (node.lo, node.hi) == (0, 1) else f"{{{node.lo}}}" if node.lo == node.hi else f"{{{node.lo},{node.hi}}}"


def _undefined(kind: str, ref: Ref, known: list[str], inside: str = "") -> str:
    close = difflib.get_close_matches(ref.name, known, n=1)
    hint = f"did you mean {close[0]!r}? " if close else ""
    place = [f"line {ref.line}, column {ref.column}"] if ref.line else []
    where = f" ({', '.join([*place, *([f'in {inside}'] if inside else [])])})" if place or inside else ""
    how = "define it (`NAME: ...`) or `%import common.NAME`" if kind == "terminal" else "define it (`name: ...`)"
    return f"the {kind} {ref.name!r}{where} is not defined; {hint}{how}"


def _imports(grammar: LarkGrammar, budget: CompileBudget) -> dict[str, str]:
    common = _Terminals(_common(), budget, {})
    out: dict[str, str] = {}
    for item in grammar.imports:
        if item.module != "common":
            raise UnsupportedGrammarError(
                f"`%import {item.module}.{item.name}` (line {item.line}): only Lark's `common` terminals can be "
                "imported; copy the definitions into the grammar")
        if item.name not in _common() or item.name.startswith("_"):
            known = sorted(n for n in _common() if not n.startswith("_"))
            raise UndefinedRuleError(f"`%import common.{item.name}` (line {item.line}): common has no terminal "
                                     f"{item.name!r}; it has {', '.join(known)}")
        if item.alias in grammar.terminals or item.alias in grammar.rules:
            raise UnsupportedGrammarError(
                f"`%import common.{item.name}` (line {item.line}) collides with the definition of {item.alias}; "
                "rename one of them (`%import common.X -> OTHER`)")
        out[item.alias] = common.text(Ref(item.name, item.line))
    return out


class _Rules:
    """Rule texts: calls for recursive rules, short others inlined."""

    def __init__(self, bodies: dict[str, Node], terminals: _Terminals, ignore: str, budget: CompileBudget) -> None:
        self.bodies = bodies
        self.terminals = terminals
        self.ignore = ignore
        self.budget = budget
        graph = {name: rule_refs(body, _is_rule) for name, body in bodies.items()}
        self.recursive = {name for component in strongly_connected(graph) for name in component
                          if len(component) > 1 or name in graph[name]}
        self.inline_texts: dict[str, str] = {}
        self.numbers: dict[str, int] = {}
        self.order: list[str] = []

    def use(self, name: str) -> str:
        """The text of a use of rule `name`: a call, or its text inlined."""
        if name not in self.recursive:
            text = self.inline_texts.get(name)
            if text is None:
                text = self.inline_texts[name] = self.expr(self.bodies[name], name)
            if len(text) <= INLINE_CHARS:
                return f"(?:{text})"
        number = self.numbers.get(name)
        if number is None:
            number = self.numbers[name] = len(self.order) + 1
            if number >= MAX_RULES:
                raise SchemaTooComplexError(f"the grammar needs more than {MAX_RULES - 1} called rules; merge rules")
            self.order.append(name)
        return call_regex(number)

    def body(self, name: str) -> str:
        """The full text of a called rule."""
        return self.inline_texts.get(name) or self.expr(self.bodies[name], name)

    def expr(self, node: Node, rule: str) -> str:
        if isinstance(node, Ref):
            if _is_rule(node.name):
                text = self.use(node.name)
            else:
                text = f"(?:{self.terminals.text(node)}){self.ignore}"
        elif isinstance(node, Seq):
            text = "".join(self.expr(item, rule) for item in node.items)
        elif isinstance(node, Alt):
            text = "(?:" + "|".join(self.expr(item, rule) for item in node.items) + ")"
        elif isinstance(node, Rep):
            text = f"(?:{self.expr(node.item, rule)})" + _quantifier(node)
        else:
            text = f"(?:{leaf_regex(node, f'rule {rule}')}){self.ignore}"
        self.budget.spend("text", len(text))
        return text


_UNITS = ((" ", " "), ("\t", r"\t"), ("\n", r"\n"), ("\r\n", r"\r\n"), ("\r", r"\r"), ("\f", r"\f"), ("\v", r"\v"))


def _whitespace_unit(text: str) -> str | None:
    """For an `%ignore` pattern that writes whitespace only and repeats without bound (`WS`: `/[ \t\f\r\n]+/`):
    the regex of its one-character matches (and `\r\n`), so that `max_ignored` bounds characters, not runs: one
    match of `WS` let a small model write whitespace until `max_new_tokens`. None for any other pattern."""
    try:
        tree = parse_regex(text)
    except (Unsupported, re.error):
        return None
    nodes, chars, unbounded = [tree], set(), False
    while nodes:
        node = nodes.pop()
        if node.kind == "look":
            return None
        if node.kind == "set":
            if any(hi - lo > 64 for lo, hi in node.ranges):
                return None  # (a wide class is not whitespace; checked before its code points are listed)
            chars.update(cp for lo, hi in node.ranges for cp in range(lo, hi + 1))
        unbounded |= node.kind == "rep" and node.hi is None
        nodes.extend(node.children)
    if not unbounded or not all(chr(cp).isspace() for cp in chars):
        return None
    try:
        units = [regex for unit, regex in _UNITS if re.fullmatch(text, unit)]
    except re.error:  # (syntax our reader takes and Python's does not: left as written)
        return None
    return "(?:" + "|".join(units) + ")" if units else None


def compile_lark(source: str, start: str = "start", budget: CompileBudget | None = None,
                 max_ignored: int | None = None) -> LarkCompiled:
    """Compile a Lark EBNF grammar to a `Grammar` (or a plain regex) for `GuidedLogitsProcessor`. `max_ignored`:
    the most matches of the `%ignore` patterns before, between or after tokens, a whitespace run counted by its
    characters (`_whitespace_unit`); None: any number, runs as long as they like (Lark's meaning).

    Raises:
        GrammarSyntaxError, UndefinedRuleError, LeftRecursionError, UnsupportedGrammarError (`GrammarError`s);
        UnsatisfiableSchemaError: a rule derives no finite text; SchemaTooComplexError: over `budget`.
    """
    budget = budget if budget is not None else CompileBudget()
    grammar = parse_lark(source)
    if not grammar.rules:
        raise UndefinedRuleError("the grammar defines no rule; write at least `start: ...` (a lowercase name)")
    if start not in grammar.rules:
        raise UndefinedRuleError(_undefined("rule", Ref(start), list(grammar.rules)).replace(
            "define it (`name: ...`)", "define it, or pass `start=` naming the rule where documents begin"))
    terminals = _Terminals(grammar.terminals, budget, _imports(grammar, budget))
    bodies: dict[str, Node] = {}
    rewritten: list[str] = []
    pending = [start]
    try:
        while pending:  # the rules reachable from start (others are never used: not compiled, not checked)
            name = pending.pop()
            if name in bodies:
                continue
            body = grammar.rules[name].body
            simpler = rewrite_left_recursion(name, body)
            if simpler is not None:
                body = simpler
                rewritten.append(name)
            bodies[name] = body
            for ref in _refs(body):
                if _is_rule(ref.name):
                    if ref.name not in grammar.rules:
                        raise UndefinedRuleError(_undefined("rule", ref, list(grammar.rules)))
                    pending.append(ref.name)
                else:
                    terminals.text(ref)  # (undefined or recursive terminals are refused here, in source order)
        _check_unused(grammar, terminals.texts)
        check_rules(bodies, lambda leaf: re.fullmatch(
            terminals.text(leaf) if isinstance(leaf, Ref) else leaf_regex(leaf, "a rule"), "") is not None)
        ignores = [terminals.expr(node, "%ignore") for node in grammar.ignores]
        if max_ignored is not None:
            ignores = [_whitespace_unit(text) or text for text in ignores]
        repeat = "*" if max_ignored is None else "?" if max_ignored == 1 else f"{{0,{max_ignored}}}"
        ignore = f"(?:{'|'.join(ignores)}){repeat}" if ignores and max_ignored != 0 else ""
        rules = _Rules(bodies, terminals, ignore, budget)
        root = ignore + rules.use(start) if start in rules.recursive else ignore + rules.expr(bodies[start], start)
        texts = []
        while len(texts) < len(rules.order):  # (a rule's text may call rules not numbered yet)
            texts.append(rules.body(rules.order[len(texts)]))
    except RecursionError:
        raise SchemaTooComplexError(
            "the grammar nests too deeply to compile (rules or groups hundreds of levels deep); flatten it") from None
    constraint = Grammar(root, tuple(texts)) if texts else root
    return LarkCompiled(constraint, ("", *rules.order), tuple(sorted(rewritten)))


def _check_unused(grammar: LarkGrammar, imported: dict[str, str]) -> None:
    """Refuse, as Lark does, an undefined name or a recursive terminal in a definition the start rule never reaches
    (those are not compiled): the README promises `UndefinedRuleError` for any undefined rule or terminal."""
    terminal_refs: dict[str, set[str]] = {}
    for kind, definitions in (("rule", grammar.rules), ("terminal", grammar.terminals)):
        for name, definition in definitions.items():
            used = set()
            for ref in _refs(definition.body):
                if _is_rule(ref.name) and ref.name not in grammar.rules:
                    raise UndefinedRuleError(_undefined("rule", ref, list(grammar.rules), f"the {kind} {name}"))
                if not _is_rule(ref.name) and ref.name not in grammar.terminals and ref.name not in imported:
                    raise UndefinedRuleError(_undefined("terminal", ref, [*grammar.terminals, *imported],
                                                        f"the {kind} {name}"))
                used.add(ref.name)
            if kind == "terminal":
                terminal_refs[name] = used & grammar.terminals.keys()
    for component in strongly_connected(terminal_refs):
        if len(component) > 1 or component[0] in terminal_refs[component[0]]:
            cycle = " -> ".join([*component, component[0]])
            raise UnsupportedGrammarError(
                f"the terminal {component[0]} refers to itself ({cycle}); terminals are regular: make the recursive "
                "part a rule (a lowercase name)")


def _refs(node: Node) -> list[Ref]:
    out, stack = [], [node]
    while stack:
        current = stack.pop()
        if isinstance(current, Ref):
            out.append(current)
        elif isinstance(current, (Seq, Alt)):
            stack.extend(reversed(current.items))
        elif isinstance(current, Rep):
            stack.append(current.item)
    return out
