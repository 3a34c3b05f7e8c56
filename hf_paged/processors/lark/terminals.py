"""Lark terminals (literals, `"a".."z"` ranges, Python `/regex/flags`) -> regex text our automaton reads.

The text is written in the plain subset our fast reader parses (`automaton/syntax.py`: escaped characters,
classes of `\\xHH`/`\\uHHHH` ranges, `(?:...)`, `|`, quantifiers), whatever the user wrote: case-insensitive
flags become classes (`[aA]`), `\\d \\w \\s` their code point ranges.

A grammar's rule texts must never match the bytes that mark calls (`automaton.grammar`: 0x02 and 0x0E..0x1F): every
class, `.` and negated literal is intersected with the characters outside them; a literal that holds one of them
cannot be produced and is refused (`UnsupportedGrammarError`). Lazy quantifiers (`*?`) are read as greedy ones:
a terminal is the *set* of strings its regex matches, not the one match Python's `re` prefers. Lark's own Earley
`dynamic_complete` lexer reads a terminal as the match `re` prefers and its prefixes, so it refuses a few texts of
that set (`/a|ab/` never reads `ab`, `/a+?/` only `a`; `tests/processors/test_lark_set_semantics.py`).
"""

from __future__ import annotations

import bisect
import re
import re._constants as C  # type: ignore[import-not-found]
import re._parser as P  # type: ignore[import-not-found]
from functools import lru_cache

from hf_paged.errors import SchemaTooComplexError, UnsupportedGrammarError
from hf_paged.processors.automaton.charsets import Ranges, complement, normalize
from hf_paged.processors.automaton.python_syntax import EVERYTHING, class_ranges
from hf_paged.processors.automaton.tree import Unsupported

__all__ = ["RESERVED", "literal_regex", "python_regex", "range_regex", "set_regex"]

RESERVED: Ranges = ((0x02, 0x02), (0x0E, 0x1F))  # call marks of `automaton.grammar`: never inside a rule's text
_ALLOWED: Ranges = complement(normalize(RESERVED))
_PLAIN = re.compile(r"[A-Za-z0-9 _]")
_EMPTY_CLASS = "[^\\x00-\\U0010ffff]"  # a class of no code point, in the syntax our fast reader parses
_FLAGS = {"i": re.IGNORECASE, "m": re.MULTILINE, "s": re.DOTALL, "x": re.VERBOSE, "u": re.UNICODE}


def _char(cp: int) -> str:
    """One code point as regex text (outside or inside a class)."""
    if cp < 0x80 and _PLAIN.match(chr(cp)):
        return chr(cp)
    return f"\\x{cp:02x}" if cp <= 0xFF else f"\\u{cp:04x}" if cp <= 0xFFFF else f"\\U{cp:08x}"


def _allowed(ranges: Ranges) -> Ranges:
    """`ranges` without the reserved code points."""
    return complement(normalize([*complement(ranges), *RESERVED]))


def set_regex(ranges: Ranges, where: str) -> str:
    """A class matching one code point of `ranges`, minus the reserved ones (a class of none when `ranges` is empty).

    Raises:
        UnsupportedGrammarError: nothing is left (the class held only reserved control characters).
    """
    if not ranges:  # an empty class (`[^\s\S]`): it matches no character, as in the regex (a rule needing it
        return _EMPTY_CLASS  # is dropped; a grammar that needs it everywhere matches no text)
    kept = _allowed(ranges)
    if not kept:
        raise UnsupportedGrammarError(
            f"{where} matches only control characters 0x02/0x0E..0x1F, which constrained decoding reserves; "
            "remove them from the terminal")
    if len(kept) == 1 and kept[0][0] == kept[0][1]:
        return _char(kept[0][0])
    return "[" + "".join(_char(lo) if lo == hi else f"{_char(lo)}-{_char(hi)}" for lo, hi in kept) + "]"


@lru_cache(maxsize=1)
def _cased() -> tuple[list[int], list[tuple[int, ...]]]:
    """The code points (below U+20000) whose case differs, and their other-case single characters."""
    points, variants = [], []
    for cp in range(0x20000):
        c = chr(cp)
        others = tuple(sorted({ord(v) for v in (c.lower(), c.upper(), c.swapcase()) if len(v) == 1} - {cp}))
        if others:
            points.append(cp)
            variants.append(others)
    return points, variants


def _case_closed(ranges: Ranges) -> Ranges:
    """`ranges` plus the other case of each of its characters (Python's simple case folding, as `re.I` does)."""
    extra: list[tuple[int, int]] = []
    if sum(hi - lo + 1 for lo, hi in ranges) <= 256:  # a literal or a small class: no table needed
        for lo, hi in ranges:
            for cp in range(lo, hi + 1):
                c = chr(cp)
                extra.extend((ord(v), ord(v)) for v in (c.lower(), c.upper(), c.swapcase()) if len(v) == 1)
        return normalize([*ranges, *extra])
    points, variants = _cased()
    for lo, hi in ranges:
        for i in range(bisect.bisect_left(points, lo), bisect.bisect_right(points, hi)):
            extra.extend((v, v) for v in variants[i])
    return normalize([*ranges, *extra])


def literal_regex(text: str, ci: bool, where: str) -> str:
    """The regex text of a string literal (`ci`: case-insensitive, Lark's `"..."i`).

    Raises:
        UnsupportedGrammarError: the literal holds a reserved control character (0x02, 0x0E..0x1F).
    """
    parts = []
    for c in text:
        if _allowed(((ord(c), ord(c)),)) == ():
            raise UnsupportedGrammarError(
                f"{where} holds the control character {c!r}, which constrained decoding reserves (0x02, "
                "0x0E..0x1F mark rule calls); remove it from the literal")
        parts.append(set_regex(_case_closed(((ord(c), ord(c)),)), where) if ci else _char(ord(c)))
    return "".join(parts)


def range_regex(lo: str, hi: str, where: str) -> str:
    """The regex text of Lark's `"a".."z"`."""
    return set_regex(normalize([(ord(lo), ord(hi))]), where)


def python_regex(pattern: str, flags: str, where: str) -> str:
    """The regex text of a Lark `/pattern/flags` terminal (Python `re` syntax).

    Raises:
        UnsupportedGrammarError: flags other than `imsux`, anchors, word boundaries, look-around,
            back-references, conditionals, atomic groups, possessive repetitions (not regular, or meaningless
            inside a terminal), or a pattern Python's `re` does not read.
        SchemaTooComplexError: nested too deeply to parse.
    """
    bits = 0
    for flag in flags:
        if flag not in _FLAGS:
            raise UnsupportedGrammarError(f"the regex flag {flag!r} of {where} is not supported; use i, m, s, u or x")
        bits |= _FLAGS[flag]
    try:
        parsed = P.parse(pattern, bits)
    except re.error as exc:
        raise UnsupportedGrammarError(f"{where} is not a valid Python regex ({exc}); fix the pattern") from None
    except RecursionError:
        raise SchemaTooComplexError(f"{where} nests groups too deeply to parse; flatten it") from None
    try:
        return _Emitter(where).seq(list(parsed), parsed.state.flags)
    except RecursionError:
        raise SchemaTooComplexError(f"{where} nests groups too deeply to compile; flatten it") from None


class _Emitter:
    """Walks Python's parse of a regex (`re._parser`) and writes our text."""

    def __init__(self, where: str) -> None:
        self.where = where

    def seq(self, items: list, flags: int) -> str:
        return "".join(self.item(op, av, flags) for op, av in items)

    def cased(self, ranges: Ranges, flags: int) -> Ranges:
        return _case_closed(ranges) if flags & re.IGNORECASE else ranges

    def item(self, op, av, flags: int) -> str:
        if op is C.LITERAL:
            if flags & re.IGNORECASE:
                return set_regex(_case_closed(((av, av),)), self.where)
            return literal_regex(chr(av), False, self.where)
        if op is C.NOT_LITERAL:
            return set_regex(complement(self.cased(((av, av),), flags)), self.where)
        if op is C.ANY:
            return set_regex(EVERYTHING if flags & re.DOTALL else complement(((10, 10),)), self.where)
        if op is C.IN:
            return set_regex(self.klass(av, flags), self.where)
        if op is C.BRANCH:
            return "(?:" + "|".join(self.seq(list(branch), flags) for branch in av[1]) + ")"
        if op is C.SUBPATTERN:
            _, add, remove, sub = av
            return "(?:" + self.seq(list(sub), (flags | add) & ~remove) + ")"
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # (lazy or greedy: the same set of strings)
            lo, hi, sub = av
            body = "(?:" + self.seq(list(sub), flags) + ")"
            if hi is C.MAXREPEAT:
                return body + ("*" if lo == 0 else "+" if lo == 1 else f"{{{lo},}}")
            return body + ("?" if (lo, hi) == (0, 1) else f"{{{lo}}}" if lo == hi else f"{{{lo},{hi}}}")
        what = {C.AT: "anchors or word boundaries", C.ASSERT: "look-around", C.ASSERT_NOT: "look-around",
                C.GROUPREF: "back-references", C.GROUPREF_EXISTS: "conditionals", C.ATOMIC_GROUP: "atomic groups",
                C.POSSESSIVE_REPEAT: "possessive repetitions"}.get(op, f"the regex operation {op}")
        raise UnsupportedGrammarError(
            f"{self.where} uses {what}, which a terminal compiled to an automaton cannot express; rewrite the "
            "pattern without it (split it into rules and terminals)")

    def klass(self, items: list, flags: int) -> Ranges:
        try:
            ranges, negate = class_ranges(items, bool(flags & re.ASCII))
        except Unsupported as exc:
            raise UnsupportedGrammarError(f"{self.where} uses the {exc}; rewrite the class") from None
        result = self.cased(ranges, flags)
        return complement(result) if negate else result
