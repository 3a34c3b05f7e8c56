"""Regex text (Rust `regex` syntax, as outlines-core reads it) -> a `Node` tree, fast for the syntax we emit.

The schema translator writes a small, regular syntax: literal characters, escaped punctuation, `\\xHH` / `\\uHHHH`,
classes, `(?:...)`, `|` and quantifiers. One master regex tokenizes it (C speed) and a stack builds the tree;
classes are parsed once per distinct text. Anything else (`\\d`, flags, `\\b`, look-around, a `{` that is not a
quantifier, ...) is read by Python's parser (`python_syntax.py`), which also decides what to leave to
outlines-core (`Unsupported`).
"""

from __future__ import annotations

import re
from functools import lru_cache

from hf_paged.processors.automaton.charsets import MAX_CODE_POINT, Ranges, complement, normalize
from hf_paged.processors.automaton.python_syntax import parse_python
from hf_paged.processors.automaton.tree import END, START, Node, Unsupported

__all__ = ["parse"]

_TOKEN = re.compile(
    r"""(?P<lit>[A-Za-z0-9 "'!%,/:;<=>@_`~&\-]+)
      | \\(?P<esc>[!-/:-@\[-`{-~])
      | (?P<cls>\[\^?\]?(?:\\.|[^\]\\])*\])
      | \\(?P<hex>x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[xuU]\{[0-9a-fA-F]{1,8}\})
      | (?P<open>\((?:\?:)?)
      | (?P<close>\))
      | (?P<bar>\|)
      | (?P<quant>[*+?]|\{[0-9]+(?:,[0-9]*)?\})\??
      | (?P<dot>\.)
      | (?P<anchor>[\^$])
      | \\(?P<ctl>[ntrfva])
      | (?P<other>[^\x00-\x7f])""",
    re.VERBOSE | re.DOTALL,
)
_HEX = r"x[0-9a-fA-F]{2}|u[0-9a-fA-F]{4}|U[0-9a-fA-F]{8}|[xuU]\{[0-9a-fA-F]{1,8}\}"  # (Rust's braced forms too)
_CLASS_ITEM = re.compile(rf"\\(?:{_HEX}|[ntrfva]|[!-/:-@\[-`{{-~])|[^\\]", re.DOTALL)
_CONTROL = {"n": 10, "t": 9, "r": 13, "f": 12, "v": 11, "a": 7}
_NOT_NEWLINE = complement(((10, 10),))
_DOT = Node("set", ranges=_NOT_NEWLINE)
_CHARS: dict[int, Node] = {}  # code point -> its one-character node (shared: nodes are immutable)
_CHARS_SIZE = 4096  # code points kept (~250 B each; the first met, ASCII among them): not one per character seen
_EMPTY = Node("seq")


class _Bail(Exception):
    """Syntax the fast reader does not know: Python's parser reads the pattern instead."""


def parse(regex: str) -> Node:
    """The tree of `regex` (matched against whole texts).

    Raises:
        Unsupported: Rust syntax that only outlines-core reads right.
        InvalidRegexError: look-around, back-references and the like.
        SchemaTooComplexError: nested too deeply to parse.
    """
    try:
        return _parse_fast(regex)
    except _Bail:
        return parse_python(regex)


def _char(cp: int) -> Node:
    node = _CHARS.get(cp)
    if node is None:
        node = Node("set", ranges=normalize([(cp, cp)]))
        if len(_CHARS) < _CHARS_SIZE:
            _CHARS[cp] = node
    return node


def _parse_fast(regex: str) -> Node:
    frames: list[list[list[Node]]] = [[[]]]  # open groups; each a list of alternatives, each a list of nodes
    pos = 0
    for m in _TOKEN.finditer(regex):  # (kinds tested most frequent first: classes, groups, quantifiers)
        if m.start() != pos:
            raise _Bail
        pos = m.end()
        kind = m.lastgroup
        items = frames[-1][-1]
        if kind == "cls":
            items.append(_class_node(m.group("cls")))
        elif kind == "open":
            frames.append([[]])
        elif kind == "close":
            if len(frames) == 1:
                raise _Bail  # (unbalanced: Python's parser words the error)
            items = frames[-2][-1]
            group = _group(frames.pop())
            items.append(Node("seq", children=(group,)) if group.kind in ("rep", "look") else group)
        elif kind == "quant":
            if not items or items[-1].kind in ("rep", "look"):
                raise _Bail  # nested quantifiers, a quantified anchor: let the general reader decide
            text = m.group("quant")
            lo, hi = (0, None) if text == "*" else (1, None) if text == "+" else (0, 1) if text == "?" else _count(text)
            items.append(Node("rep", children=(items.pop(),), lo=lo, hi=hi))
        elif kind == "lit":
            items.extend(map(_LITERALS.__getitem__, m.group("lit")))
        elif kind == "esc":
            items.append(_LITERALS[m.group("esc")])
        elif kind == "bar":
            frames[-1].append([])
        elif kind == "hex":
            items.append(_char(_code_point(m.group("hex"))))
        elif kind == "dot":
            items.append(_DOT)
        elif kind == "anchor":
            items.append(Node("look", lo=START if m.group("anchor") == "^" else END))
        elif kind == "ctl":
            items.append(_char(_CONTROL[m.group("ctl")]))
        else:
            items.append(_char(ord(m.group("other"))))
    if pos != len(regex) or len(frames) != 1:
        raise _Bail
    return _group(frames[0])


class _Literals(dict):
    """character -> its one-character node (`_char`), filled as characters are met: a literal run maps through
    it at C speed."""

    def __missing__(self, ch: str) -> Node:
        node = self[ch] = _char(ord(ch))
        return node


_LITERALS = _Literals()


@lru_cache(maxsize=4096)
def _class_node(text: str) -> Node:
    """The node of a class `[...]`, shared by every use of the same text (nodes are immutable)."""
    return Node("set", ranges=_class_ranges(text))


def _code_point(escape: str) -> int:
    """`x41`, `u0041`, `U00000041`, `x{41}` -> 0x41 (past U+10FFFF: an error, left to Python's parser)."""
    value = int(escape[1:].strip("{}"), 16)
    if value > MAX_CODE_POINT:
        raise _Bail
    return value


def _group(alternatives: list[list[Node]]) -> Node:
    nodes = [items[0] if len(items) == 1 else Node("seq", children=tuple(items)) if items else _EMPTY
             for items in alternatives]
    return nodes[0] if len(nodes) == 1 else Node("alt", children=tuple(nodes))


def _count(text: str) -> tuple[int, int | None]:
    lo, _, hi = text[1:-1].partition(",")
    if not _:
        return int(lo), int(lo)
    if hi and int(hi) < int(lo):
        raise _Bail  # (an error in both engines: Python's parser words it)
    return int(lo), int(hi) if hi else None


def _class_ranges(text: str) -> Ranges:
    """Code point ranges of a class `[...]` (no nested classes: Rust reads `[` inside a class as one)."""
    body = text[1:-1]
    negate = body.startswith("^")
    if negate:
        body = body[1:]
    points: list[int | None] = []  # code points, None for a range dash
    for i, m in enumerate(_CLASS_ITEM.finditer(body)):
        item = m.group()
        if item == "[" or (item in ("&", "-", "~") and body.startswith(item * 2, m.start())):
            raise Unsupported("nested classes or class set operations (Rust reads them differently)")
        if item == "-" and 0 < i and m.end() < len(body):
            points.append(None)
        elif item[0] != "\\" or len(item) == 1:
            points.append(ord(item))
        elif item[1] in _CONTROL:
            points.append(_CONTROL[item[1]])
        elif len(item) == 2:
            points.append(ord(item[1]))
        else:
            points.append(_code_point(item[1:]))
    if sum(len(m.group()) for m in _CLASS_ITEM.finditer(body)) != len(body):
        raise _Bail
    ranges: list[tuple[int, int]] = []
    i = 0
    while i < len(points):
        lo = points[i]
        if lo is None:
            raise _Bail
        if i + 2 < len(points) and points[i + 1] is None and points[i + 2] is not None:
            hi = points[i + 2]
            if hi < lo or hi > MAX_CODE_POINT:
                raise _Bail  # (an invalid range: Python's parser words the error)
            ranges.append((lo, hi))
            i += 3
        else:
            ranges.append((lo, lo))
            i += 1
    if not ranges and not negate:
        raise _Bail
    result = normalize(ranges)
    return complement(result) if negate else result
