"""Regex fragments for the JSON-Schema translation: a tiny algebra over regex text with a size estimate.

Every fragment is written in the common subset of Python `re` and Rust `regex-automata` (the engine under
outlines-core): no lookaround, no backreferences, no `\\d`/`\\w` (both engines make them Unicode-aware), code
points escaped as `\\xHH` / `\\uHHHH`, ASCII punctuation always backslash-escaped. So the same text can be
checked with `re.fullmatch` in tests and benchmarks and compiled by `outlines_core.Index`.

`None` stands for the empty language (no text matches): combinators propagate it, which is how an
unsatisfiable sub-schema (a required property whose schema admits nothing, a recursion cut off at its depth
limit) removes exactly the alternatives that need it instead of producing invalid output.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from json.encoder import encode_basestring
from typing import NamedTuple

__all__ = [
    "MAX_CODE_POINT",
    "Rx",
    "alt",
    "char_class",
    "class_char",
    "class_cost",
    "escape_text",
    "json_string",
    "lit",
    "opt",
    "raw",
    "rep",
    "seq",
]

MAX_CODE_POINT = 0x10FFFF
_META = frozenset("\\.+*?()|[]{}^$#&-~")
_SURROGATES = (0xD800, 0xDFFF)


class Rx(NamedTuple):
    """A regex fragment: its text and an estimate of the automaton it unrolls into.

    `cost` grows with the text, and multiplies through counted repetitions (`x{0,100}` costs ~100x `x`),
    because the DFA that outlines-core builds unrolls them; the translator compares it to its budget.
    Immutable; a named tuple, not a frozen dataclass: a big schema's translation makes ~50k of them, and a frozen
    dataclass's `__init__` costs several times a tuple's.
    """

    text: str  # regex source, always safe to concatenate (alternations are wrapped in a group)
    cost: int  # estimated automaton size, ~4x the DFA states outlines-core builds (len(text) for literals)
    group: bool = False  # known to be one group `(?:...)` (an alternation): quantified as it is, no scan of the text
    compound: bool = False  # known to be two or more atoms (a concatenation): grouped before a quantifier, no scan


def raw(text: str, *, atomic: bool = False) -> Rx:
    """Wrap regex source written by hand. Non-atomic text is grouped before it is repeated or concatenated."""
    return Rx(text if atomic or _is_atomic(text) else f"(?:{text})", len(text))


def lit(text: str) -> Rx:
    """A fragment matching exactly `text`."""
    return Rx(escape_text(text), len(text))


def seq(*parts: Rx | None) -> Rx | None:
    """Concatenation; the empty language if any part is."""
    # (one pass, no generators: a big schema's translation concatenates ~50k times)
    cost = 0
    texts: list[str] = []
    last: Rx | None = None
    for p in parts:
        if p is None:
            return None
        cost += p.cost
        if p.text:
            texts.append(p.text)
            last = p
    if len(texts) == 1:  # (one part with text: its own flags hold)
        return Rx(last.text, cost, last.group, last.compound)  # type: ignore[union-attr]
    return Rx("".join(texts), cost, False, len(texts) > 1)


def alt(parts: Iterable[Rx | None]) -> Rx | None:
    """Alternation of the parts that are not empty; duplicates dropped (order kept)."""
    seen: dict[str, Rx] = {}
    cost = 0
    for p in parts:
        if p is not None and p.text not in seen:
            seen[p.text] = p
            cost += p.cost
    if not seen:
        return None
    if len(seen) == 1:
        return next(iter(seen.values()))
    return Rx("(?:" + "|".join(seen) + ")", cost + len(seen), True)


def opt(part: Rx | None) -> Rx:
    """Zero or one occurrence (the empty string when `part` is the empty language)."""
    if part is None or part.text == "":
        return Rx("", 0)
    return Rx(_group_of(part) + "?", part.cost + 1)


def rep(part: Rx | None, lo: int, hi: int | None) -> Rx | None:
    """`part` repeated lo..hi times (hi None: unbounded). Cost multiplies by the unrolled count."""
    if hi is not None and hi < lo:
        return None
    if part is None:
        return Rx("", 0) if lo == 0 else None
    if hi == 0 or part.text == "":
        return Rx("", 0)
    if (lo, hi) == (1, 1):
        return part
    if lo == hi == 0:
        return Rx("", 0)
    g = _group_of(part)
    if hi is None:
        quant = "*" if lo == 0 else "+" if lo == 1 else "{%d,}" % lo
        return Rx(g + quant, part.cost * max(lo, 1) + 2)
    quant = "?" if (lo, hi) == (0, 1) else "{%d}" % lo if lo == hi else "{%d,%d}" % (lo, hi)
    return Rx(g + quant, part.cost * hi + 2)


_SURROGATE = re.compile("[\ud800-\udfff]")


def json_string(text: str) -> str:
    """`json.dumps(text, ensure_ascii=False)`, with lone surrogates (which a JSON text may hold as `\\uXXXX` escapes,
    `json.loads` reads them back, but UTF-8 cannot encode) written as escapes."""
    out = encode_basestring(text)  # (what `json.dumps` calls for a str, without its ~2 us of setup: 16x as fast)
    return _SURROGATE.sub(lambda m: f"\\u{ord(m.group()):04x}", out) if _SURROGATE.search(out) else out


def escape_text(text: str) -> str:
    """Escape a literal for both engines (only code points that are safe and unambiguous stay bare)."""
    if text.isascii() and text.isalnum():
        return text
    return text.translate(_LITERAL_ESCAPES)  # (C speed: big enums write tens of thousands of literals)


class _EscapeTable(dict):
    """`str.translate`'s table of `_escape_char` outside classes, filled as code points are met."""

    def __missing__(self, cp: int) -> str:
        escaped = self[cp] = _escape_char(cp, in_class=False)
        return escaped


_LITERAL_ESCAPES = _EscapeTable()


def char_class(ranges: list[tuple[int, int]]) -> str | None:
    """A positive character class over sorted, disjoint code point ranges (surrogates are skipped)."""
    items: list[str] = []
    for lo, hi in ranges:
        for a, b in _minus_surrogates(lo, hi):
            if a == b:
                items.append(_escape_char(a, in_class=True))
            elif b == a + 1:
                items.append(_escape_char(a, in_class=True) + _escape_char(b, in_class=True))
            else:
                items.append(_escape_char(a, in_class=True) + "-" + _escape_char(b, in_class=True))
    if not items:
        return None
    if len(ranges) == 1 and ranges[0][0] == ranges[0][1]:
        return items[0]  # a single code point needs no class
    return "[" + "".join(items) + "]"


def class_char(cp: int) -> str:
    """Code point `cp` as written inside a character class."""
    return _escape_char(cp, in_class=True)


def _minus_surrogates(lo: int, hi: int) -> list[tuple[int, int]]:
    s_lo, s_hi = _SURROGATES
    out = []
    if lo < s_lo:
        out.append((lo, min(hi, s_lo - 1)))
    if hi > s_hi:
        out.append((max(lo, s_hi + 1), hi))
    return [(a, b) for a, b in out if a <= b]


def _escape_char(cp: int, *, in_class: bool) -> str:
    c = chr(cp)
    if c.isascii() and c.isalnum():
        return c
    if cp < 0x20 or cp == 0x7F:
        return "\\x%02x" % cp
    if cp < 0x80:
        # Only meta characters are escaped: Rust reads some other escapes as assertions (`\<` is a word
        # boundary there). `&`, `-`, `~` are set operators inside Rust classes, so they are escaped too.
        return "\\" + c if c in _META else c
    if cp <= 0xFFFF:
        return "\\u%04x" % cp
    return c  # astral code points: both engines take them literally (no common escape syntax)


def _group_of(part: Rx) -> str:
    """`part`'s text, grouped unless it is one atom already (an alternation's group is known without a scan:
    the scan is Python over the whole text, and the translation groups big alternations often)."""
    if part.group:
        return part.text
    return f"(?:{part.text})" if part.compound else _group(part.text)


def _group(text: str) -> str:
    return text if _is_atomic(text) else f"(?:{text})"


def _is_atomic(text: str) -> bool:
    """True when `text` is a single atom a quantifier can follow without a group."""
    if len(text) == 1 and text not in "()[]{}|*+?.^$\\":
        return True
    if len(text) == 2 and text[0] == "\\":
        return True
    if text.startswith("\\x") and len(text) == 4 or text.startswith("\\u") and len(text) == 6:
        return True
    if text.startswith("[") and text.endswith("]") and _class_end(text) == len(text) - 1:
        return True
    if text.startswith("(") and text.endswith(")") and _group_end(text) == len(text) - 1:
        return True
    return False


def _class_end(text: str) -> int:
    i = 1
    while i < len(text):
        if text[i] == "\\":
            i += 2
            continue
        if text[i] == "]":
            return i
        i += 1
    return -1


def _group_end(text: str) -> int:
    """Where the group that `text` opens closes (-1: never): parentheses counted outside escapes and classes,
    the text scanned by one regex at C speed (big alternations' texts run to megabytes)."""
    depth = 0
    for m in _GROUP_TOKENS.finditer(text):
        token = m.group()
        if token == "(":
            depth += 1
        elif token == ")":
            depth -= 1
            if depth == 0:
                return m.start()
    return -1


_GROUP_TOKENS = re.compile(r"\\.|\[(?:\\.|[^\]\\])*\]|[()]", re.DOTALL)  # an escape, a class, a parenthesis


def class_cost(text: str) -> int:
    """Cost of one character class: a broad non-ASCII class unrolls into ~8 UTF-8 states (measured)."""
    return 30 if ("\\u" in text or "^" in text[:2] or any(ord(c) > 0x7F for c in text)) else 4
