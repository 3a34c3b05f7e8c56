"""Regexes of JSON object keys: a key whose text is none of a set of names (a complement trie), and ECMA
`patternProperties` patterns tested on a declared name. `objects.py` builds objects from them."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from hf_paged.processors.schema.fragments import Rx, alt, char_class, escape_text, raw, rep, seq
from hf_paged.processors.schema.pattern import Node, parse_pattern

__all__ = ["KeyMatch", "bare_char", "key_matches", "key_readings", "not_in"]

_KEY_CHARS = [(0x20, 0x21), (0x23, 0x5B), (0x5D, 0x7E)]  # extra keys: printable ASCII, no escapes (cheap classes)


@dataclass(slots=True, frozen=True)
class KeyMatch:
    """Whether a `patternProperties` pattern applies to one property name, under each reading a validator may use.

    The two disagree on a few names (`\\s` and U+FEFF, `\\d` and non-ASCII digits, `.` and `\\r`, `$` before a
    final newline): where they do, the pattern's schema is applied (stricter under either validator), and so is
    `additionalProperties` when under one reading no pattern applies (`objects.py`)."""

    ecma: bool  # ECMA-262 search (what JSON Schema specifies; ajv and most non-Python validators)
    python: bool  # `re.search(pattern, name)`, what `jsonschema` does

    @property
    def either(self) -> bool:
        return self.ecma or self.python


def key_matches(pattern: str, name: str, where: str) -> bool:
    """Whether `pattern` applies to the property `name` under ECMA or Python search semantics (`KeyMatch.either`)."""
    return key_readings(pattern, name, where).either


def key_readings(pattern: str, name: str, where: str) -> KeyMatch:
    """ECMA and Python `pattern` search on the decoded property name (never its JSON spelling: a name with `\\`,
    `"` or a control character is written with escapes that the pattern's classes do not describe)."""
    ecma, python = _name_regexes(pattern, where)
    return KeyMatch(ecma=ecma.fullmatch(name) is not None, python=python.search(name) is not None)


@lru_cache(maxsize=512)
def _name_regexes(pattern: str, where: str) -> tuple[re.Pattern, re.Pattern]:
    """`key_readings`' two compiled regexes over a decoded name, memoised: an object tests every declared name
    against each of its patterns, and the ladder translates the schema once per try (a pattern's parse ~2 ms;
    errors are not memoised, so each names its own place). ECMA: the pattern's `Node` with ECMA's classes, anchors
    resolved (a whole-name match); Python: the pattern itself, after the one ECMA spelling `parse_pattern` rewrites
    too (named groups `(?<n>`)."""
    node = parse_pattern(pattern, where, ecma=True)
    return re.compile(_decoded(node)), re.compile(re.sub(r"\(\?<(?![=!])", "(?P<", pattern))


def _decoded(node: Node) -> str:
    """A Python regex of the code point strings `node` matches (every code point as `\\U........`)."""
    if node.kind == "set":
        if not node.ranges:
            return "(?!)"
        return "[" + "".join(f"\\U{lo:08x}" + ("" if lo == hi else f"-\\U{hi:08x}") for lo, hi in node.ranges) + "]"
    if node.kind == "seq":
        return "(?:" + "".join(_decoded(kid) for kid in node.children) + ")"
    if node.kind == "alt":
        return "(?:" + "|".join(_decoded(kid) for kid in node.children) + ")"
    return f"(?:{_decoded(node.children[0])}){{{node.lo},{'' if node.hi is None else node.hi}}}"


def not_in(names: list[str]) -> Rx:
    """JSON keys (with quotes) whose text is none of `names`: bare characters through a complement trie, or, when
    no name holds a quote or a backslash, any key with an escaped one (`"Vendor\\\\Package"`)."""
    return _not_in_names(tuple(names))


@lru_cache(maxsize=256)
def _not_in_names(names: tuple[str, ...]) -> Rx:
    """`not_in`, memoised: an object's complement trie is the same for each count of its members (~1 ms).

    A key that is no name either leaves the names' trie on a character no name has there, then goes on freely,
    or stops at a trie node where no name ends. Both walks of the trie share their characters in the automaton
    (the same text drives them), and every way out reaches one free tail: about one state per trie node, where a
    tail after each way out (`[^..][..]*` at every node) doubles the states and the regex text."""
    key_char = Rx(char_class(_KEY_CHARS) or "", 4)
    leave, short = _walk(tuple(sorted(set(names))))
    quote = raw('"', atomic=True)
    bare = seq(quote, alt([seq(leave, rep(key_char, 0, None)), short]), quote)
    if any('"' in name or "\\" in name for name in names):
        return bare  # type: ignore[return-value]
    escape = raw('\\\\["\\\\]', atomic=True)  # \" or \\ in the JSON text
    char = alt([key_char, escape])
    escaped = seq(quote, rep(char, 0, None), escape, rep(char, 0, None), quote)
    return alt([bare, escaped])  # type: ignore[return-value]


# The names' trie, walked as sorted suffixes: a node is the sorted, distinct suffixes of the names below it ("" first
# where a name ends), a kid the suffixes that start with its character, that character cut. Most nodes lie on one
# name's own tail (a single suffix): its texts are written in one pass (`_tail`), memoised by the suffix.


def _walk(suffixes: tuple[str, ...]) -> tuple[Rx | None, Rx | None]:
    """(keys leaving the trie at the root or below, keys ending there or below): `alt` of `seq(lit(c), ...)` per
    kid, written as text directly (the same fragments, ~5x faster than through the combinators: an object's names
    are a trie of ~60 nodes, one of MaskBench's of 7,000)."""
    leave, leave_cost, leave_compound, short, short_cost, short_compound = _walk_parts(suffixes)
    return _alt_of(leave, leave_cost, leave_compound), _alt_of(short, short_cost, short_compound)


def _alt_of(parts: list[str], cost: int, compound: bool) -> Rx | None:
    """`alt` of fragments given as texts, their costs summed (`compound`: the flag of a single part)."""
    if not parts:
        return None
    if len(parts) == 1:
        return Rx(parts[0], cost, False, compound)
    return Rx("(?:" + "|".join(parts) + ")", cost + len(parts), True)


def _kids(suffixes: tuple[str, ...]) -> list[tuple[str, tuple[str, ...]]]:
    """The kids of a node: (character, the kid's suffixes), in character order."""
    kids: list[tuple[str, tuple[str, ...]]] = []
    first, group = "", []
    for suffix in suffixes:
        if not suffix:
            continue
        if suffix[0] != first:
            if group:
                kids.append((first, tuple(group)))
            first, group = suffix[0], []
        group.append(suffix[1:])
    if group:
        kids.append((first, tuple(group)))
    return kids


def bare_char(c: str) -> bool:
    """Whether a key character is spelled bare (quotes, backslashes and control characters need escapes)."""
    return c >= " " and c != '"' and c != "\\"


def _walk_parts(suffixes: tuple[str, ...]) -> tuple[list[str], int, bool, list[str], int, bool]:
    """`_walk`'s alternatives unjoined: (texts, summed cost, whether a single text is compound) for the keys
    leaving, then for the keys ending. The texts are distinct (each starts with its own kid's character; the
    others' class holds none of them), so `alt`'s dropping of duplicates has nothing to drop."""
    kids = _kids(suffixes)
    others = _key_chars_but(tuple(c for c, _ in kids))
    leave, leave_cost = ([], 0) if others is None else ([others], 4)
    short: list[str] = [] if suffixes and not suffixes[0] else [""]
    short_cost, leave_compound, short_compound = 0, False, False
    for c, below in kids:
        if bare_char(c):
            below_leave, below_leave_cost, below_short, below_short_cost = _node_text(below)
            char = escape_text(c)  # (`lit(c)`: cost 1)
            if below_leave is not None:
                leave.append(char + below_leave)
                leave_cost += 1 + below_leave_cost
                leave_compound = below_leave != ""
            if below_short is not None:
                short.append(char + below_short)
                short_cost += 1 + below_short_cost
                short_compound = below_short != ""
    return leave, leave_cost, leave_compound, short, short_cost, short_compound


def _node_text(suffixes: tuple[str, ...]) -> tuple[str | None, int, str | None, int]:
    """A node below the root as (text, cost) pairs, the keys leaving then the keys ending, joined as `alt` joins."""
    if len(suffixes) == 1:
        return _tail(suffixes[0])
    kids = _kids(suffixes)
    others = _key_chars_but(tuple(c for c, _ in kids))
    leave, leave_cost = ([], 0) if others is None else ([others], 4)
    short: list[str] = [] if not suffixes[0] else [""]
    short_cost = 0
    for c, below in kids:
        if bare_char(c):
            below_leave, below_leave_cost, below_short, below_short_cost = _node_text(below)
            char = _bare(c)
            if below_leave is not None:
                leave.append(char + below_leave)
                leave_cost += 1 + below_leave_cost
            if below_short is not None:
                short.append(char + below_short)
                short_cost += 1 + below_short_cost
    if len(leave) > 1:
        leave_text: str | None = "(?:" + "|".join(leave) + ")"
        leave_cost += len(leave)
    else:
        leave_text = leave[0] if leave else None
    if len(short) > 1:
        short_text: str | None = "(?:" + "|".join(short) + ")"
        short_cost += len(short)
    else:
        short_text = short[0] if short else None
    return leave_text, leave_cost, short_text, short_cost


def _bare(c: str) -> str:
    return c if c.isalnum() and c.isascii() else escape_text(c)  # (`escape_text`'s own shortcut)


@lru_cache(maxsize=8192)
def _tail(suffix: str) -> tuple[str | None, int, str | None, int]:
    """`_node_text` of a node on one name's own tail (`suffix` still to spell; "" where the name ends), in one pass,
    memoised. Each character c of the tail is a node with the one kid c (no name ends there): keys leave through
    the others' class or go on, `(?:[others]|c ...)` (cost 4 + 1 + below + 2); keys end there or go on,
    `(?:|c ...)` (cost 1 + below + 2), or just "" above the name's own end. Its first character that needs an
    escape ends the walk: its kid is never spelled (the node's texts: the others' class, and "")."""
    end = next((k for k, c in enumerate(suffix) if not bare_char(c)), None)
    chain = suffix if end is None else suffix[:end]
    if end is None:  # the name's end: no kid; keys leave through any character, none may end here
        leave, leave_cost, short, short_cost = _key_chars_but(()), 4, None, 0
    else:
        leave, leave_cost, short, short_cost = _key_chars_but((suffix[end],)), 4, "", 0
    if not chain:
        return leave, leave_cost, short, short_cost
    parts: list[str] = []
    for c in chain:
        others = _key_chars_but((c,))
        assert others is not None, "the key characters are more than one"
        parts += ("(?:", others, "|", _bare(c))
    leave_text = "".join(parts) + leave + ")" * len(chain)  # type: ignore[operator]
    spelled = [_bare(c) for c in chain]
    closed = len(chain) if short is not None else len(chain) - 1  # (above the name's end: "" only)
    short_text = "".join(f"(?:|{char}" for char in spelled[:closed]) + (short or "") + ")" * closed
    return leave_text, leave_cost + 7 * len(chain), short_text, short_cost + 3 * closed


@lru_cache(maxsize=4096)
def _key_chars_but(kids: tuple[str, ...]) -> str | None:
    """The class of the undeclared keys' characters other than `kids`, memoised: a trie's nodes mostly have one
    kid, and the same few letters recur (measured on the 30 slowest MaskBench schemas: the trie's writing -25%)."""
    return char_class(_minus(_KEY_CHARS, [(ord(c), ord(c)) for c in kids]))


def _minus(ranges: list[tuple[int, int]], holes: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out = []
    for lo, hi in ranges:
        cur = lo
        for a, b in sorted(holes):
            if b < cur or a > hi:
                continue
            if a > cur:
                out.append((cur, a - 1))
            cur = max(cur, b + 1)
        if cur <= hi:
            out.append((cur, hi))
    return out
