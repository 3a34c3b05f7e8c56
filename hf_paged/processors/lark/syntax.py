"""Lark's EBNF grammar syntax -> a `LarkGrammar` value (rules, terminals, `%ignore`s, `%import`s): our own reader.

    name: alt | alt          a rule (lowercase; `?`/`!` modifiers, `.n` priorities and `-> alias` read, ignored)
    NAME: ...                a terminal (uppercase): regular, expanded inline where it is used
    "lit"  "lit"i  /re/flags "a".."z"   terminals written in place
    x? x* x+ [x] (x) x~n x~n..m        repetition and grouping
    %ignore X   %import common.X [-> Y]   %import common (X, Y)

Statements end at a newline; a line that starts with `|` continues the previous one (as in Lark). `//` and `#`
start comments. Templates, `%declare`, `%override` and `%extend` are refused (`UnsupportedGrammarError`); a
syntax error names its line and column (`GrammarSyntaxError`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from hf_paged.errors import GrammarSyntaxError, UnsupportedGrammarError

__all__ = ["Alt", "CharRange", "Definition", "Import", "LarkGrammar", "Lit", "Node", "Ref", "Rep", "Rx", "Seq",
           "parse_lark", "unescape"]


@dataclass(slots=True, frozen=True)
class Lit:
    """A string literal (already unescaped); `ci`: Lark's `"..."i`."""

    text: str
    ci: bool = False


@dataclass(slots=True, frozen=True)
class Rx:
    """A `/regex/flags` terminal: Python `re` syntax, after Lark's escape processing."""

    pattern: str
    flags: str = ""


@dataclass(slots=True, frozen=True)
class CharRange:
    """`"a".."z"`: one character from `lo` to `hi`."""

    lo: str
    hi: str


@dataclass(slots=True, frozen=True)
class Ref:
    """A use of a rule (lowercase) or terminal (uppercase) name, where it was written."""

    name: str
    line: int = 0
    column: int = 0


@dataclass(slots=True, frozen=True)
class Seq:
    items: tuple[Node, ...]


@dataclass(slots=True, frozen=True)
class Alt:
    items: tuple[Node, ...]


@dataclass(slots=True, frozen=True)
class Rep:
    """`lo` .. `hi` copies of `item` (`hi` None: unbounded)."""

    item: Node
    lo: int
    hi: int | None


Node = Lit | Rx | CharRange | Ref | Seq | Alt | Rep


@dataclass(slots=True, frozen=True)
class Definition:
    """One rule or terminal definition."""

    name: str
    body: Node
    line: int


@dataclass(slots=True, frozen=True)
class Import:
    """`%import module.name -> alias`."""

    module: str
    name: str
    alias: str
    line: int


@dataclass(slots=True)
class LarkGrammar:
    """A grammar as written: definitions by name, in order; what `%ignore` names; what `%import` brings."""

    rules: dict[str, Definition] = field(default_factory=dict)
    terminals: dict[str, Definition] = field(default_factory=dict)
    ignores: list[Node] = field(default_factory=list)
    imports: list[Import] = field(default_factory=list)


_TOKEN = re.compile(
    r"""(?P<nl>\r?\n)
      | (?P<ws>[ \t\f\r]+|\\[ \t]*\r?\n)
      | (?P<comment>(?://|\#)[^\n]*)
      | (?P<string>"(?:\\.|[^"\\\n])*"i?)
      | (?P<regexp>/(?!/)(?:\\.|[^/\\])*/[imslux]*)
      | (?P<arrow>->)
      | (?P<dotdot>\.\.)
      | (?P<directive>%[a-z]+)
      | (?P<name>[!?]{0,2}_?[A-Za-z][_A-Za-z0-9]*)
      | (?P<number>[+-]?[0-9]+)
      | (?P<op>[+*?])
      | (?P<punct>[()\[\]{}:,|~.])""",
    re.VERBOSE,
)
_RULE = re.compile(r"_?[a-z][_a-z0-9]*")
_TERMINAL = re.compile(r"_?[A-Z][_A-Z0-9]*")


@dataclass(slots=True, frozen=True)
class _Tok:
    kind: str
    text: str
    line: int
    column: int


def _tokens(source: str) -> list[_Tok]:
    out, pos, line, line_start = [], 0, 1, 0
    while pos < len(source):
        m = _TOKEN.match(source, pos)
        if m is None:
            raise GrammarSyntaxError(f"unexpected character {source[pos]!r} at line {line}, column "
                                     f"{pos - line_start + 1}; fix the grammar there")
        kind = m.lastgroup or ""
        if kind not in ("ws", "comment"):
            out.append(_Tok(kind, m.group(), line, pos - line_start + 1))
        for nl in re.finditer("\n", m.group()):
            line, line_start = line + 1, m.start() + nl.end()
        pos = m.end()
    out.append(_Tok("nl", "\n", line, pos - line_start + 1))
    out.append(_Tok("end", "", line + 1, 1))
    return out


def unescape(body: str) -> str:
    """Lark's escape processing of a literal's or regex's text: `\\n \\t \\r \\f \\xHH \\uHHHH \\UHHHHHHHH` become
    their characters, `\\"` a quote; `\\\\` and any other `\\c` are kept as written (a regex reads them)."""
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\" or i + 1 >= len(body):
            out.append(c)
            i += 1
            continue
        n = body[i + 1]
        width = {"x": 2, "u": 4, "U": 8}.get(n)
        if width is not None:
            digits = body[i + 2:i + 2 + width]
            if len(digits) != width or not all(d in "0123456789abcdefABCDEF" for d in digits):
                raise ValueError(f"bad escape \\{n}{digits}")
            out.append(chr(int(digits, 16)))
            i += 2 + width
            continue
        out.append({"n": "\n", "t": "\t", "r": "\r", "f": "\f", '"': '"'}.get(n, "\\" + n))
        i += 2
    return "".join(out)


class _Parser:
    def __init__(self, source: str) -> None:
        self.toks = _tokens(source)
        self.pos = 0
        self.grammar = LarkGrammar()

    # -- token helpers ---------------------------------------------------------------------------------
    def peek(self) -> _Tok:
        return self.toks[self.pos]

    def next(self) -> _Tok:
        tok = self.toks[self.pos]
        self.pos += 1
        return tok

    def at(self, kind: str, text: str | None = None) -> bool:
        tok = self.peek()
        return tok.kind == kind and (text is None or tok.text == text)

    def expect(self, kind: str, text: str | None = None, what: str = "") -> _Tok:
        if not self.at(kind, text):
            self.fail(f"expected {what or text or kind}")
        return self.next()

    def fail(self, message: str, tok: _Tok | None = None) -> None:
        tok = tok or self.peek()
        found = "the end of the grammar" if tok.kind == "end" else "a newline" if tok.kind == "nl" else repr(tok.text)
        raise GrammarSyntaxError(f"{message} at line {tok.line}, column {tok.column} (found {found}); fix the "
                                 "grammar there (Lark EBNF: `name: alternative | alternative`)")

    def continuation(self) -> bool:
        """Newlines followed by `|` continue the statement: skip them."""
        at = self.pos
        while self.toks[at].kind == "nl":
            at += 1
        if at > self.pos and self.toks[at].kind == "punct" and self.toks[at].text == "|":
            self.pos = at
            return True
        return False

    # -- statements ------------------------------------------------------------------------------------
    def parse(self) -> LarkGrammar:
        while not self.at("end"):
            if self.at("nl"):
                self.next()
                continue
            tok = self.peek()
            if tok.kind == "directive":
                self.directive()
            elif tok.kind == "name":
                self.definition()
            else:
                self.fail("expected a rule, a terminal or a %directive")
            if not self.at("end"):
                self.expect("nl", what="the end of the line")
        return self.grammar

    def definition(self) -> None:
        tok = self.next()
        name = tok.text.lstrip("!?")
        is_rule = _RULE.fullmatch(name) is not None
        if not is_rule and (_TERMINAL.fullmatch(name) is None or name != tok.text):
            self.fail("expected a rule name (lowercase) or a terminal name (uppercase)", tok)
        if self.at("punct", "{"):
            raise UnsupportedGrammarError(
                f"templates (`{name}{{...}}` at line {tok.line}) are not supported; write the rule out for each use")
        if self.at("punct", "."):  # a priority: changes which parse Lark prefers, never the language
            self.next()
            self.expect("number", what="a priority number after `.`")
        self.expect("punct", ":", what="`:` after the name")
        table = self.grammar.rules if is_rule else self.grammar.terminals
        if name in table:
            self.fail(f"{name!r} is defined twice (first at line {table[name].line}); keep one definition", tok)
        table[name] = Definition(name, self.expansions(), tok.line)

    def directive(self) -> None:
        tok = self.next()
        if tok.text == "%ignore":
            self.grammar.ignores.append(self.expansions())
        elif tok.text == "%import":
            self.import_()
        elif tok.text in ("%declare", "%override", "%extend"):
            raise UnsupportedGrammarError(
                f"`{tok.text}` (line {tok.line}) is not supported: it changes imported grammars or declares "
                "terminals for a custom lexer; define the rules and terminals in the grammar itself")
        else:
            self.fail(f"unknown directive {tok.text!r} (Lark has %ignore, %import, %declare, %override, %extend)",
                      tok)

    def import_(self) -> None:
        first = self.expect("name", what="a module after %import")
        path = [first.text]
        while self.at("punct", "."):
            self.next()
            path.append(self.expect("name", what="a name after `.`").text)
        if self.at("punct", "("):
            self.next()
            names = [self.expect("name", what="a name").text]
            while self.at("punct", ","):
                self.next()
                names.append(self.expect("name", what="a name").text)
            self.expect("punct", ")")
            self.grammar.imports.extend(Import(".".join(path), n, n, first.line) for n in names)
            return
        if len(path) < 2:
            self.fail("expected `%import module.NAME` or `%import module (NAME, ...)`")
        alias = path[-1]
        if self.at("arrow"):
            self.next()
            alias = self.expect("name", what="a name after `->`").text
        self.grammar.imports.append(Import(".".join(path[:-1]), path[-1], alias, first.line))

    # -- expressions -----------------------------------------------------------------------------------
    def expansions(self) -> Node:
        alternatives = [self.alias()]
        while self.at("punct", "|") or self.continuation():
            self.next()
            alternatives.append(self.alias())
        return alternatives[0] if len(alternatives) == 1 else Alt(tuple(alternatives))

    def alias(self) -> Node:
        body = self.expansion()
        if self.at("arrow"):  # `-> name` renames the tree node: the language is the same
            self.next()
            self.expect("name", what="an alias name after `->`")
        return body

    def expansion(self) -> Node:
        items = []
        while self.peek().kind in ("string", "regexp", "name") or self.at("punct", "(") or self.at("punct", "["):
            items.append(self.expr())
        return items[0] if len(items) == 1 else Seq(tuple(items))

    def expr(self) -> Node:
        atom = self.atom()
        if self.at("op"):
            op = self.next().text
            return Rep(atom, 0 if op in "*?" else 1, 1 if op == "?" else None)
        if self.at("punct", "~"):
            self.next()
            lo = int(self.expect("number", what="a count after `~`").text)
            hi = lo
            if self.at("dotdot"):
                self.next()
                hi = int(self.expect("number", what="a count after `..`").text)
            if lo < 0 or hi < lo:
                self.fail(f"the repetition ~ {lo}..{hi} is empty; write `~ low..high` with 0 <= low <= high")
            return Rep(atom, lo, hi)
        return atom

    def atom(self) -> Node:
        tok = self.next()
        if tok.kind == "punct" and tok.text in "([":
            body = self.expansions()
            self.expect("punct", ")" if tok.text == "(" else "]")
            return body if tok.text == "(" else Rep(body, 0, 1)
        if tok.kind == "name":
            if self.at("punct", "{"):
                raise UnsupportedGrammarError(
                    f"template uses (`{tok.text}{{...}}` at line {tok.line}) are not supported; write the rule out")
            if tok.text != tok.text.lstrip("!?"):
                self.fail("modifiers `!`/`?` go only before a rule's definition", tok)
            return Ref(tok.text, tok.line, tok.column)
        if tok.kind == "regexp":
            end = tok.text.rindex("/")
            return Rx(self.unescaped(tok, tok.text[1:end]), tok.text[end + 1:])
        if tok.kind == "string":
            ci = tok.text.endswith("i")
            text = self.unescaped(tok, tok.text[1:-2] if ci else tok.text[1:-1]).replace("\\\\", "\\")
            if self.at("dotdot"):
                self.next()
                end = self.expect("string", what='a string after `..` ("a".."z")')
                hi = self.unescaped(end, end.text[1:-1]).replace("\\\\", "\\")
                if len(text) != 1 or len(hi) != 1 or hi < text:
                    self.fail('a range is two one-character strings in order, like "a".."z"', end)
                return CharRange(text, hi)
            if not text:
                self.fail("empty string literals are not allowed (as in Lark); drop it or make the part optional",
                          tok)
            return Lit(text, ci)
        self.pos -= 1
        self.fail("expected a name, a string, a /regex/, `(` or `[`")
        raise AssertionError  # (unreachable: fail raises)

    def unescaped(self, tok: _Tok, body: str) -> str:
        try:
            return unescape(body)
        except ValueError as exc:
            self.fail(f"{exc} in {tok.text}", tok)
            raise AssertionError from None


def parse_lark(source: str) -> LarkGrammar:
    """Read a grammar in Lark's EBNF syntax (see the module docstring).

    Raises:
        GrammarSyntaxError: the text is not a grammar (the message names the line and column).
        UnsupportedGrammarError: templates, `%declare`, `%override`, `%extend`.
    """
    if not isinstance(source, str):
        raise GrammarSyntaxError(f"a grammar is Lark EBNF text, got {type(source).__name__}; pass a string")
    return _Parser(source).parse()
