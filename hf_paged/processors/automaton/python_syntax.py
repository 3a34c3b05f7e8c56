"""Regex text -> `Node` tree through Python's own parser (`re._parser`): the general reader, for patterns the fast
reader (`syntax.py`) leaves (`\\d \\w \\s`, flags, named groups, unusual escapes).

Python's parser reads the common subset of Python and Rust syntax. What it would read differently from Rust, or
not at all (`\\p{..}`, `\\x{..}`, nested classes and class set operations, word boundaries, case-insensitive
flags, multi-line anchors) raises `Unsupported`, and the caller compiles the pattern with outlines-core instead.
Look-around and back-references are errors in both engines.
"""

from __future__ import annotations

import re
import re._constants as C  # type: ignore[import-not-found]
import re._parser as P  # type: ignore[import-not-found]

from hf_paged.errors import InvalidRegexError, SchemaTooComplexError
from hf_paged.processors.automaton.charsets import MAX_CODE_POINT, Ranges, category, complement, normalize
from hf_paged.processors.automaton.tree import END, START, Node, Unsupported

__all__ = ["EVERYTHING", "class_ranges", "parse_python", "rust_only"]

_RUST_ONLY = ("\\p", "\\P", "\\x{", "\\u{", "\\U{", "\\z")
_TOKENS = re.compile(r"\\.|(\[\^?\]?(?:\\.|[^\]\\])*\])", re.DOTALL)  # escapes (skipped) and whole classes
_ESCAPE = re.compile(r"\\.", re.DOTALL)
_CATEGORIES = {
    C.CATEGORY_DIGIT: ("digit", False), C.CATEGORY_NOT_DIGIT: ("digit", True),
    C.CATEGORY_WORD: ("word", False), C.CATEGORY_NOT_WORD: ("word", True),
    C.CATEGORY_SPACE: ("space", False), C.CATEGORY_NOT_SPACE: ("space", True),
}
EVERYTHING: Ranges = normalize([(0, MAX_CODE_POINT)])  # (every scalar value: no surrogates)


def rust_only(regex: str) -> str | None:
    """What in `regex` Python's parser reads differently from Rust's, or not at all, ahead of parsing (it would
    also warn: "Possible set intersection"), or None."""
    if any(marker in regex for marker in _RUST_ONLY):
        return "Rust-only escapes"
    for body in _TOKENS.findall(regex):  # (Python warns on `||` too; Rust reads it as two `|`: ours to read)
        if body and any(op in _ESCAPE.sub("e", body[1:-1]) for op in ("[", "&&", "--", "~~", "||")):
            return "nested classes or class set operations"
    return None


def parse_python(regex: str) -> Node:
    """The tree of `regex` (matched against whole texts).

    Raises:
        Unsupported: Rust syntax Python reads differently (compile with outlines-core instead).
        InvalidRegexError: look-around, back-references, atomic groups, possessive repeats.
        SchemaTooComplexError: nested too deeply for the parser.
    """
    why = rust_only(regex)
    if why is not None:
        raise Unsupported(why)
    source = re.sub(r"\(\?<(?![=!])", "(?P<", regex) if "(?<" in regex else regex
    try:
        parsed = P.parse(source)
    except re.error as exc:
        raise Unsupported(str(exc)) from None  # (outlines-core decides whether it is Rust syntax)
    except RecursionError:
        raise SchemaTooComplexError("the regex nests groups too deeply to parse; flatten it") from None
    flags = parsed.state.flags
    if flags & (re.IGNORECASE | re.LOCALE):
        raise Unsupported("case-insensitive flag")
    try:
        return _seq(list(parsed), bool(flags & re.DOTALL), bool(flags & re.ASCII), bool(flags & re.MULTILINE))
    except RecursionError:
        raise SchemaTooComplexError("the regex nests groups too deeply to compile; flatten it") from None


def _seq(items: list, dotall: bool, ascii_only: bool, multiline: bool) -> Node:
    parts = [_item(op, av, dotall, ascii_only, multiline) for op, av in items]
    return parts[0] if len(parts) == 1 else Node("seq", children=tuple(parts))


def _item(op, av, dotall: bool, ascii_only: bool, multiline: bool) -> Node:
    if op is C.LITERAL:
        return Node("set", ranges=normalize([(av, av)]))
    if op is C.NOT_LITERAL:
        return Node("set", ranges=complement(normalize([(av, av)])))
    if op is C.ANY:
        return Node("set", ranges=EVERYTHING if dotall else complement(((10, 10),)))
    if op is C.IN:
        return Node("set", ranges=_class(av, ascii_only))
    if op is C.BRANCH:
        return Node("alt", children=tuple(_seq(list(b), dotall, ascii_only, multiline) for b in av[1]))
    if op is C.SUBPATTERN:
        _, add, remove, sub = av
        if (add | remove) & (re.IGNORECASE | re.LOCALE):
            raise Unsupported("case-insensitive flag")
        dotall = bool(add & re.DOTALL) or (dotall and not remove & re.DOTALL)
        ascii_only = bool(add & re.ASCII) or (ascii_only and not remove & re.ASCII)
        multiline = bool(add & re.MULTILINE) or (multiline and not remove & re.MULTILINE)
        return _seq(list(sub), dotall, ascii_only, multiline)
    if op in (C.MAX_REPEAT, C.MIN_REPEAT):
        lo, hi, sub = av
        return Node("rep", children=(_seq(list(sub), dotall, ascii_only, multiline),), lo=lo,
                    hi=None if hi is C.MAXREPEAT else hi)
    if op is C.AT:
        if av in (C.AT_BEGINNING, C.AT_BEGINNING_STRING) and not (multiline and av is C.AT_BEGINNING):
            return Node("look", lo=START)
        if av in (C.AT_END, C.AT_END_STRING) and not (multiline and av is C.AT_END):
            return Node("look", lo=END)
        raise Unsupported("word boundaries or multi-line anchors")
    what = {C.ASSERT: "look-around", C.ASSERT_NOT: "look-around", C.GROUPREF: "back-references",
            C.GROUPREF_EXISTS: "conditionals", C.ATOMIC_GROUP: "atomic groups",
            C.POSSESSIVE_REPEAT: "possessive repetitions"}.get(op)
    if what is None:
        raise Unsupported(f"regex operation {op}")
    raise InvalidRegexError(f"the regex uses {what}, which a regular automaton cannot express (Rust `regex` "
                            "syntax has none); rewrite the pattern without it")


def _class(items: list, ascii_only: bool) -> Ranges:
    ranges, negate = class_ranges(items, ascii_only)
    return complement(ranges) if negate else ranges


def class_ranges(items: list, ascii_only: bool) -> tuple[Ranges, bool]:
    """The code points a parsed class `[...]` lists (normalized) and whether it is negated (`[^...]`).

    Raises:
        Unsupported: an item that is not a literal, a range or one of `\\d \\w \\s` and their negations.
    """
    ranges: list[tuple[int, int]] = []
    negate = False
    for op, av in items:
        if op is C.NEGATE:
            negate = True
        elif op is C.LITERAL:
            ranges.append((av, av))
        elif op is C.RANGE:
            ranges.append(av)
        elif op is C.CATEGORY and av in _CATEGORIES:
            name, negated = _CATEGORIES[av]
            members = category(name, ascii_only)
            ranges.extend(complement(members) if negated else members)
        else:
            raise Unsupported(f"class item {op}")
    return normalize(ranges), negate
