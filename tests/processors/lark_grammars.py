"""Grammars and string generators for the Lark grammar tests and benchmark: three grammars in Lark EBNF, random
sentences derived from a grammar's own definitions (independently of how we compile it to rules), random walks of
a compiled automaton, and mutations; `lark` (test extra) is the judge."""

from __future__ import annotations

import random
import re

from hf_paged.processors.automaton import anchored
from hf_paged.processors.automaton.byte_dfa import build_byte_dfa
from hf_paged.processors.lark.compile import _common, leaf_regex
from hf_paged.processors.lark.syntax import (
    Alt,
    CharRange,
    LarkGrammar,
    Lit,
    Node,
    Ref,
    Rep,
    Rx,
    Seq,
    parse_lark,
)

ARITHMETIC = r"""
?start: expr
?expr: expr "+" term | expr "-" term | term
?term: term "*" factor | term "/" factor | factor
?factor: NUMBER | "-" factor | "(" expr ")"
%import common.NUMBER
%import common.WS_INLINE
%ignore WS_INLINE
"""

SQL = r"""
start: select_stmt
select_stmt: SELECT columns FROM table [WHERE condition] [";"]
columns: "*" | column ("," column)*
column: NAME ["." NAME]
table: NAME
condition: condition OR conjunction | conjunction
conjunction: conjunction AND comparison | comparison
comparison: operand OP operand | "(" condition ")" | NOT comparison
operand: column | NUMBER | STRING
OP: "=" | "<>" | "!=" | "<=" | ">=" | "<" | ">"
SELECT: "select"i
FROM: "from"i
WHERE: "where"i
AND: "and"i
OR: "or"i
NOT: "not"i
NAME: CNAME
STRING: /'[^']*'/
%import common.CNAME
%import common.INT -> NUMBER
%import common.WS
%ignore WS
"""

PYTHONISH = r"""
start: stmt+
stmt: assign | if_stmt | while_stmt | print_stmt
assign: NAME "=" expr ";"
print_stmt: "print" "(" expr ")" ";"
if_stmt: "if" expr block ["else" block]
while_stmt: "while" expr block
block: "{" stmt* "}"
expr: expr COMP sum | sum
sum: sum ADDOP product | product
product: product MULOP atom | atom
atom: NUMBER | NAME | "(" expr ")" | ESCAPED_STRING
COMP: "==" | "!=" | "<" | ">"
ADDOP: "+" | "-"
MULOP: "*" | "/" | "%"
NAME: /[a-z_][a-z0-9_]*/
%import common.INT -> NUMBER
%import common.ESCAPED_STRING
%import common.WS
%ignore WS
"""

JSON = r"""
?start: value
?value: object | array | string | SIGNED_NUMBER | "true" | "false" | "null"
array: "[" [value ("," value)*] "]"
object: "{" [pair ("," pair)*] "}"
pair: string ":" value
string: ESCAPED_STRING
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""

GRAMMARS = {"arithmetic": ARITHMETIC, "sql": SQL, "pythonish": PYTHONISH, "json": JSON}


def lark_parser(grammar: str, **kwargs):
    """The independent judge: Lark's Earley parser, terminals matched as sets of strings (`dynamic_complete`)."""
    import lark

    return lark.Lark(grammar, parser="earley", lexer="dynamic_complete", **kwargs)


def lark_accepts(parser, text: str) -> bool:
    import lark

    try:
        parser.parse(text)
    except lark.exceptions.LarkError:
        return False
    return True


def plain(grammar: str) -> str:
    """The grammar without `?` rule modifiers, so every rule keeps its node in Lark's trees (coverage)."""
    return re.sub(r"^\?", "", grammar, flags=re.MULTILINE)


def _walk(dfa, rng: random.Random, max_len: int, stop: float, alphabet: bytes) -> bytes | None:
    """A random accepted string of a byte automaton over `alphabet` (None when the walk got stuck or too long):
    at a final state it stops with probability `stop`; otherwise, with that probability, it takes a byte that
    reaches a final state when there is one."""
    state, out = dfa.initial, bytearray()
    while len(out) < max_len:
        dfa.ensure_one(state)
        if dfa.finals[state] and rng.random() < stop:
            return bytes(out)
        live = [b for b in alphabet if dfa.transitions[state, b] != dfa.dead]
        if not live:
            return bytes(out) if dfa.finals[state] else None
        if rng.random() < stop:
            ending = []
            for b in live:
                dfa.ensure_one(int(dfa.transitions[state, b]))
                if dfa.finals[int(dfa.transitions[state, b])]:
                    ending.append(b)
            live = ending or live
        byte = rng.choice(live)
        out.append(byte)
        state = int(dfa.transitions[state, byte])
    return None


ASCII = bytes(range(0x20, 0x7F)) + b"\n\t\r\f"


def walk(dfa, rng: random.Random, max_len: int = 60, stop: float = 0.15) -> str | None:
    """A random string our automaton accepts (printable ASCII, newline, tab)."""
    data = _walk(dfa, rng, max_len, stop, ASCII)
    return None if data is None else data.decode()


class Sentences:
    """Random sentences derived from a Lark grammar's definitions (depth-bounded); terminal leaves drawn by walking
    the leaf's own regex automaton; ignored text inserted at random between tokens."""

    def __init__(self, grammar: str, start: str = "start", seed: int = 0) -> None:
        self.grammar: LarkGrammar = parse_lark(grammar)
        self.start = start
        self.rng = random.Random(seed)
        self.imports = {i.alias: i.name for i in self.grammar.imports}
        self._dfas: dict[str, object] = {}
        self.heights = dict.fromkeys(self.grammar.rules, 10**9)  # fewest rule levels to a finished text
        for _ in range(len(self.heights) + 1):
            for name, definition in self.grammar.rules.items():
                self.heights[name] = min(self.heights[name], self._height(definition.body) + 1)

    def _height(self, node: Node) -> int:
        if isinstance(node, Ref):
            return self.heights.get(node.name, 0)
        if isinstance(node, Seq):
            return max((self._height(i) for i in node.items), default=0)
        if isinstance(node, Alt):
            return min(self._height(i) for i in node.items)
        if isinstance(node, Rep):
            return 0 if node.lo == 0 else self._height(node.item)
        return 0

    def _leaf(self, node: Node) -> str:
        key = repr(node)
        dfa = self._dfas.get(key)
        if dfa is None:
            dfa = self._dfas[key] = build_byte_dfa(anchored(leaf_regex(node, "test")))
        for _ in range(50):
            text = _walk(dfa, self.rng, 12, 0.3, ASCII)
            if text is not None:
                return text.decode()
        raise AssertionError(f"no sample for {node}")

    def _ignored(self) -> str:
        if not self.grammar.ignores or self.rng.random() < 0.6:
            return ""
        return self.expand(self.rng.choice(self.grammar.ignores), 0, token=True)

    def expand(self, node: Node, depth: int, token: bool = False) -> str:
        """`token`: inside a terminal (no ignored text)."""
        rng = self.rng
        if isinstance(node, Ref):
            if node.name in self.grammar.rules:
                return self.expand(self.grammar.rules[node.name].body, depth + 1, token)
            definition = self.grammar.terminals.get(node.name) or _common()[self.imports.get(node.name, node.name)]
            text = self.expand(definition.body, depth, True)
            return text if token else text + self._ignored()
        if isinstance(node, Seq):
            return "".join(self.expand(item, depth, token) for item in node.items)
        if isinstance(node, Alt):
            items = node.items
            if depth > 6:  # the alternatives that end soonest
                least = min(map(self._height, items))
                items = tuple(i for i in items if self._height(i) == least)
            return self.expand(rng.choice(items), depth, token)
        if isinstance(node, Rep):
            hi = node.hi if node.hi is not None else node.lo + (3 if depth < 6 else 0)
            count = rng.randint(node.lo, max(node.lo, min(hi, node.lo + 3)))
            return "".join(self.expand(node.item, depth, token) for _ in range(count))
        assert isinstance(node, (Lit, Rx, CharRange))
        text = node.text if isinstance(node, Lit) and not node.ci else self._leaf(node)
        return text if token else text + self._ignored()

    def sentence(self) -> str:
        return self._ignored() + self.expand(self.grammar.rules[self.start].body, 0)


def mutations(text: str, rng: random.Random, count: int, alphabet: str) -> list[str]:
    """`count` random edits of `text` (a character deleted, inserted, replaced, or two swapped)."""
    out = []
    for _ in range(count):
        chars = list(text)
        kind = rng.randrange(4)
        i = rng.randrange(len(chars) + 1)
        if kind == 0 and chars:
            del chars[min(i, len(chars) - 1)]
        elif kind == 1:
            chars.insert(i, rng.choice(alphabet))
        elif kind == 2 and chars:
            chars[min(i, len(chars) - 1)] = rng.choice(alphabet)
        elif len(chars) > 1:
            j = min(i, len(chars) - 2)
            chars[j], chars[j + 1] = chars[j + 1], chars[j]
        out.append("".join(chars))
    return out
