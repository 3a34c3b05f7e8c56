"""ECMA-262 `pattern` -> a regex over the JSON-encoded string body, optionally intersected with a length range.

A schema `pattern` constrains the *decoded* string and is unanchored (search semantics); the regex we emit
runs over the *encoded* text between the quotes. So each code point set becomes "these code points, written
as JSON writes them" (`"` -> `\\"`, control characters -> `\\n` / `\\u00XX`), an unanchored side becomes
"any characters", and a top-level `|` stays inside the quotes (outlines-core 0.2.14 let it bind across them).

Parsing uses Python's own regex parser (`re._parser`) after rewriting the few ECMA spellings it lacks; the
classes `\\d \\w \\s` and `.` get their ECMA meaning (ASCII digits/word, ECMA whitespace, no line terminators).
Lookaround, backreferences, word boundaries, inner anchors and flags cannot be expressed: unsupported.
"""

from __future__ import annotations

import array
import json
import re
import re._constants as C  # type: ignore[import-not-found]
import re._parser as P  # type: ignore[import-not-found]
import sys
from dataclasses import dataclass
from functools import lru_cache

from hf_paged.errors import InvalidRegexError, UnsupportedSchemaError
from hf_paged.processors.schema.fragments import MAX_CODE_POINT, Rx, alt, char_class, class_cost, lit, rep, seq

__all__ = ["ALL_CHARS", "Node", "emit", "encoded_set", "fit_length", "node_length", "parse_pattern"]

Ranges = list[tuple[int, int]]
ALL_CHARS: Ranges = [(0, MAX_CODE_POINT)]
_DIGIT: Ranges = [(0x30, 0x39)]
_WORD: Ranges = [(0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)]
_SPACE: Ranges = [(0x09, 0x0D), (0x20, 0x20), (0xA0, 0xA0), (0x1680, 0x1680), (0x2000, 0x200A),
                  (0x2028, 0x2029), (0x202F, 0x202F), (0x205F, 0x205F), (0x3000, 0x3000), (0xFEFF, 0xFEFF)]
_LINE_TERMINATORS: Ranges = [(0x0A, 0x0A), (0x0D, 0x0D), (0x2028, 0x2029)]


@dataclass(slots=True, frozen=True)
class Node:
    """A parsed pattern: kind is "set" (one code point of `ranges`), "seq", "alt" or "rep"."""

    kind: str
    ranges: tuple[tuple[int, int], ...] = ()
    children: tuple[Node, ...] = ()
    lo: int = 0
    hi: int | None = None  # None: unbounded (rep only)


def _set(ranges: Ranges) -> Node:
    return Node("set", ranges=tuple(_normalize(ranges)))


ANY = Node("rep", children=(Node("set", ranges=((0, MAX_CODE_POINT),)),), lo=0, hi=None)  # unanchored side: ".*"


@lru_cache(maxsize=1024)
def parse_pattern(pattern: str, where: str, *, ecma: bool = False) -> Node:
    """Parse an ECMA pattern into a `Node` matching whole strings (anchors resolved). Memoised (the ladder translates
    a schema once per try; a `Node` is immutable); errors are not, so each names its own place.

    `\\d \\w \\s` and their negations take what both ECMA and Python's `re` accept (a text we write must pass
    both); `ecma=True`: ECMA-262's own classes, to decide whether a pattern applies to a given name, where a
    narrower reading would skip a `patternProperties` schema that an ECMA validator applies (`key_names.py`)."""
    source = re.sub(r"\(\?<(?![=!])", "(?P<", pattern)  # ECMA named groups
    if re.search(r"\\[pP]\{|\\c[A-Za-z]|\[\^?\]", source):
        raise UnsupportedSchemaError(
            f"pattern {pattern!r} at {where!r} uses \\p{{..}}, \\cX or an empty class, which we cannot translate; "
            "rewrite it with explicit character ranges"
        )
    try:
        parsed = P.parse(source)
    except re.error as exc:
        raise InvalidRegexError(f"pattern {pattern!r} at {where!r} does not compile: {exc}; fix the regex") from exc
    if parsed.state.flags & ~(re.UNICODE | getattr(re, "U", 0)):
        raise _unsupported(pattern, where, "inline flags such as (?i)")
    alternatives = _top_alternatives(list(parsed), pattern, where, ecma)
    return Node("alt", children=tuple(alternatives)) if len(alternatives) > 1 else alternatives[0]


def _top_alternatives(items: list, pattern: str, where: str, ecma: bool) -> list[Node]:
    """Split anchors off the top level: each alternative becomes [.*]body[.*] as its anchors say."""
    if len(items) == 1 and items[0][0] is C.BRANCH:
        out: list[Node] = []
        for branch in items[0][1][1]:
            out.extend(_top_alternatives(list(branch), pattern, where, ecma))
        return out
    if len(items) == 1 and items[0][0] is C.SUBPATTERN and _has_anchor(items):
        _, (_, add, dele, sub) = items[0]
        if add or dele:
            raise _unsupported(pattern, where, "inline flags")
        return _top_alternatives(list(sub), pattern, where, ecma)
    # An anchor inside a group or an alternation (Python's parser also factors a common `^` out of
    # `^a$|^b$`): distribute its branches over the rest, so every anchor ends up at an end of the text.
    for pos, (op, av) in enumerate(items):
        if op in (C.SUBPATTERN, C.BRANCH) and _has_anchor([items[pos]]):
            if op is C.SUBPATTERN:
                if av[1] or av[2]:
                    raise _unsupported(pattern, where, "inline flags")
                inner = list(av[3])
                branches = inner[0][1][1] if len(inner) == 1 and inner[0][0] is C.BRANCH else [inner]
            else:
                branches = av[1]
            out = []
            for branch in branches:
                out.extend(_top_alternatives(items[:pos] + list(branch) + items[pos + 1 :], pattern, where, ecma))
            return out
    start = bool(items) and items[0] == (C.AT, C.AT_BEGINNING)
    end = bool(items) and items[-1] == (C.AT, C.AT_END) and len(items) > int(start)
    body = items[int(start) : len(items) - int(end)]
    if _has_anchor(body):
        raise _unsupported(pattern, where, "anchors (^ $) or word boundaries (\\b \\B) inside the pattern")
    parts = ([] if start else [ANY]) + [_convert(op, av, pattern, where, ecma) for op, av in body]
    parts += [] if end else [ANY]
    return [Node("seq", children=tuple(parts))]


def _has_anchor(items: list) -> bool:
    for op, av in items:
        if op is C.AT:
            return True
        if op is C.SUBPATTERN and _has_anchor(list(av[3])):
            return True
        if op is C.BRANCH and any(_has_anchor(list(b)) for b in av[1]):
            return True
        if op in (C.MAX_REPEAT, C.MIN_REPEAT) and _has_anchor(list(av[2])):
            return True
    return False


def _convert(op, av, pattern: str, where: str, ecma: bool) -> Node:
    if op is C.LITERAL:
        return _set([(av, av)])
    if op is C.NOT_LITERAL:
        return _set(_complement([(av, av)]))
    if op is C.ANY:
        return _set(_complement(_LINE_TERMINATORS))
    if op is C.IN:
        return _set(_class(av, pattern, where, ecma))
    if op is C.SUBPATTERN:
        if av[1] or av[2]:
            raise _unsupported(pattern, where, "inline flags")
        return Node("seq", children=tuple(_convert(o, a, pattern, where, ecma) for o, a in av[3]))
    if op is C.BRANCH:
        return Node("alt", children=tuple(
            Node("seq", children=tuple(_convert(o, a, pattern, where, ecma) for o, a in b)) for b in av[1]))
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):  # lazy and greedy repeats match the same language
        lo, hi, sub = av
        body = Node("seq", children=tuple(_convert(o, a, pattern, where, ecma) for o, a in sub))
        return Node("rep", children=(body,), lo=lo, hi=None if hi == C.MAXREPEAT else hi)
    names = {C.GROUPREF: "backreferences", C.ASSERT: "lookahead/lookbehind", C.ASSERT_NOT: "negative lookaround",
             C.AT: "anchors and word boundaries", C.CATEGORY: "character categories"}
    raise _unsupported(pattern, where, names.get(op, f"the regex construct {op}"))


def _class(items: list, pattern: str, where: str, ecma: bool) -> Ranges:
    negate = items[:1] == [(C.NEGATE, None)]
    ranges: Ranges = []
    for op, av in items[1:] if negate else items:
        if op is C.LITERAL:
            ranges.append((av, av))
        elif op is C.RANGE:
            ranges.append(av)
        elif op is C.CATEGORY:  # a negated class complements its items: take their widest meaning there
            ranges.extend(_category(av, widest=negate, ecma=ecma))
        else:
            raise _unsupported(pattern, where, f"the class item {op}")
    return _complement(ranges) if negate else _normalize(ranges)


_POSITIVE = {C.CATEGORY_DIGIT: C.CATEGORY_NOT_DIGIT, C.CATEGORY_WORD: C.CATEGORY_NOT_WORD,
             C.CATEGORY_SPACE: C.CATEGORY_NOT_SPACE}  # (-> the key of `_python_category`'s table)


def _category(cat, widest: bool = False, ecma: bool = False) -> Ranges:
    r"""ECMA meaning, narrowed to what Python's `re` (used by jsonschema) also accepts: a text we write must
    pass both. \d \w stay ASCII; \s drops U+FEFF; \D \W \S exclude the Unicode digits / word / space
    characters Python counts too. `widest`: what either reading accepts, for an item of a negated class (whose
    complement must then pass both: `[^\d]` refuses the Arabic-Indic digits Python's `\d` takes)."""
    python_key = _POSITIVE.get(cat, cat)
    own = {C.CATEGORY_NOT_DIGIT: _DIGIT, C.CATEGORY_NOT_WORD: _WORD, C.CATEGORY_NOT_SPACE: _SPACE}[python_key]
    if ecma:  # ECMA-262's own class (`parse_pattern(ecma=True)`)
        return own if cat in _POSITIVE else _complement(own)
    if cat in _POSITIVE and not widest:  # (ECMA's few code points that Python's class takes too: the common case,
        # `\d` `\w` `\s`, without `_python_category`'s pass over every code point, ~80 ms on a process's first)
        matches = re.compile(_PYTHON_CLASS[python_key]).fullmatch
        return _normalize([(cp, cp) for lo, hi in own for cp in range(lo, hi + 1) if matches(chr(cp))])
    python = _python_category(python_key)
    both, either = _intersect(own, python), _normalize(own + python)
    if cat in _POSITIVE:
        return either if widest else both
    return _complement(both) if widest else _complement(either)


@lru_cache(maxsize=4)
def _python_category(cat) -> Ranges:
    """The code points Python's `re` counts as digits / space / word characters (`\\d \\s \\w` on `str`: the same
    tests as `str.isdecimal`, `str.isspace`, `isalnum() or "_"`), found by `re` itself in one pass over every code
    point (C speed: ~35 ms, against ~300 ms for a Python test per code point)."""
    return [(m.start(), m.end() - 1) for m in re.finditer(_PYTHON_CLASS[cat] + "+", _all_code_points())]


_PYTHON_CLASS = {C.CATEGORY_NOT_DIGIT: r"\d", C.CATEGORY_NOT_SPACE: r"\s", C.CATEGORY_NOT_WORD: r"\w"}


@lru_cache(maxsize=1)
def _all_code_points() -> str:
    """Every code point, U+0000..U+10FFFF in order (surrogates too), as one string (from UTF-32 words: ~15 ms)."""
    words = array.array("I", range(MAX_CODE_POINT + 1))
    if words.itemsize != 4:  # (not on any platform CPython supports today)
        return "".join(map(chr, range(MAX_CODE_POINT + 1)))
    if sys.byteorder != "little":
        words.byteswap()
    return words.tobytes().decode("utf-32-le", errors="surrogatepass")


def _minus(ranges: Ranges, holes: Ranges) -> Ranges:
    return _intersect(ranges, _complement(holes))


def _normalize(ranges: Ranges) -> Ranges:
    out: Ranges = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _complement(ranges: Ranges) -> Ranges:
    out, prev = [], 0
    for lo, hi in _normalize(ranges):
        if lo > prev:
            out.append((prev, lo - 1))
        prev = hi + 1
    if prev <= MAX_CODE_POINT:
        out.append((prev, MAX_CODE_POINT))
    return out


def _intersect(a: Ranges, b: Ranges) -> Ranges:
    out = []
    for lo1, hi1 in a:
        for lo2, hi2 in b:
            lo, hi = max(lo1, lo2), min(hi1, hi2)
            if lo <= hi:
                out.append((lo, hi))
    return _normalize(out)


def _unsupported(pattern: str, where: str, what: str) -> UnsupportedSchemaError:
    return UnsupportedSchemaError(
        f"pattern {pattern!r} at {where!r} uses {what}, which a regular expression over JSON text cannot "
        "express; rewrite the pattern without it or drop the `pattern` keyword (strict=False)"
    )


# -- lengths and emission -------------------------------------------------------------------------------

_PLAIN: Ranges = _complement([(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)])  # code points JSON writes bare


def encoded_set(ranges: Ranges) -> Rx | None:
    """One code point of `ranges`, written the way `json.dumps(ensure_ascii=False)` writes it."""
    parts: list[Rx | None] = []
    plain = char_class(_intersect(ranges, _PLAIN))
    if plain is not None:
        parts.append(Rx(plain, class_cost(plain)))
    if plain is not None:
        return alt(parts)  # escapes only when nothing bare is left: they make counted repeats costly to compile
    for lo, hi in _intersect(ranges, [(0x00, 0x1F), (0x22, 0x22), (0x5C, 0x5C)]):
        for cp in range(lo, hi + 1):
            parts.append(lit(json.dumps(chr(cp))[1:-1]))
    return alt(parts)


def node_length(node: Node, cap: int | None = None) -> tuple[int, int | None]:
    """(min, max) code points of the strings `node` matches; `cap` bounds every repetition's upper end."""
    if node.kind == "set":
        return (1, 1) if node.ranges else (0, 0)
    if node.kind == "seq":
        lo, hi = 0, 0
        for child in node.children:
            a, b = node_length(child, cap)
            lo += a
            hi = None if hi is None or b is None else hi + b
        return lo, hi
    if node.kind == "alt":
        lens = [node_length(c, cap) for c in node.children]
        his = [b for _, b in lens]
        return min(a for a, _ in lens), None if None in his else max(his)  # type: ignore[type-var]
    a, b = node_length(node.children[0], cap)
    top = _capped(node, cap)
    return a * node.lo, None if b is None or top is None else b * top


def _capped(node: Node, cap: int | None, open_too: bool = True) -> int | None:
    if cap is None or (node.hi is not None and node.hi <= cap) or (node.hi is None and not open_too):
        return node.hi
    return max(cap, node.lo)


def emit(node: Node, cap: int | None, *, open_too: bool = True) -> Rx | None:
    """Regex of the encoded strings of `node`; repetitions above `cap` are lowered to it (a subset).

    `open_too=False` leaves unbounded repetitions (`*`, `+`) alone: they cost one loop in the automaton,
    while a counter nested in another counter multiplies its states (measured: >25 s to index).
    """
    if node.kind == "set":
        return encoded_set(list(node.ranges))
    if node.kind == "seq":
        return seq(*(emit(c, cap, open_too=open_too) for c in node.children))
    if node.kind == "alt":
        return alt(emit(c, cap, open_too=open_too) for c in node.children)
    return rep(emit(node.children[0], cap, open_too=open_too), node.lo, _capped(node, cap, open_too))


def fit_length(node: Node, min_len: int, max_len: int | None, max_repeat: int) -> tuple[Node, int | None, bool] | None:
    """Make `node` match only strings of min_len..max_len code points, as a subset of its language.

    Returns (node, cap to emit it with, whether the cap also bounds open repetitions), or None when no such subset is found. Two sound moves: raise the lower
    count of one open single-character repetition to cover a missing minimum, and lower every repetition's
    upper count (one common cap) until the longest string fits the maximum.
    """
    if node_length(node)[0] < min_len:
        node = _raise_minimum(node, min_len)
        if node is None:
            return None
    if max_len is None:
        return node, max_repeat, False
    for cap in range(min(max_repeat, max_len), -1, -1):
        a, b = node_length(node, cap)
        if b is not None and b <= max_len:
            return (node, cap, True) if a <= max_len else None
    return None


def _one_code_point(node: Node) -> bool:
    """A class, or a group of just one (the parser writes `[a-z]+` as a repetition of `seq([a-z])`)."""
    return node.kind == "set" or node.kind == "seq" and len(node.children) == 1 and node.children[0].kind == "set"


def _raise_minimum(node: Node, min_len: int) -> Node | None:
    """Raise the lower count of the last open repetition of one code point until min_len is reached.

    Alternatives that cannot be raised are dropped (a subset, so still sound); None when none is left.
    """
    deficit = min_len - node_length(node)[0]
    if deficit <= 0:
        return node
    if node.kind == "alt":
        kids = [k for k in (_raise_minimum(c, min_len) for c in node.children) if k is not None]
        return Node("alt", children=tuple(kids)) if kids else None
    if node.kind != "seq":
        return None
    kids = list(node.children)
    for i in range(len(kids) - 1, -1, -1):
        k = kids[i]
        if k.kind == "rep" and _one_code_point(k.children[0]) and (k.hi is None or k.hi - k.lo >= deficit):
            kids[i] = Node("rep", children=k.children, lo=k.lo + deficit, hi=k.hi)
            return Node("seq", children=tuple(kids))
        if k.kind == "alt" and len(kids) == 1:
            return _raise_minimum(k, min_len)
    return None
