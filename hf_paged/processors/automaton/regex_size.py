"""A cheap upper-bound-ish estimate of how many positions a regex expands to once counted repetitions unroll.

regex-automata (under outlines-core) builds its NFA and DFA without a size limit, so `a{99999999}` or nested
`(x{100}){100}` exhausts memory before any error. Counting unrolled atoms in Python first lets us refuse such a
pattern with `SchemaTooComplexError` in microseconds.

A Unicode property (`\\p{L}`, `\\P{Greek}`, `\\pN`, alone or in a class) is not one position: its UTF-8 byte automaton has
up to hundreds of states (`\\p{L}`: 300), and such patterns are built by outlines-core, without a work budget (~10 ms
an occurrence: `[\\p{L}]{3000}` took 50 s of CPU while its estimate said 3,000). Each one counts as the states of its
own automaton, built once per property (`_property_size`).
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

__all__ = ["estimate_regex_size"]


@dataclass(slots=True)
class _Group:
    total: int = 0  # unrolled size of the current alternative(s) of this group
    last: int = 0  # size of the most recent atom, which a following quantifier multiplies


_PROPERTY = re.compile(r"\\([pP])(\{[^}]*\}|.)", re.DOTALL)  # \p{Name}, \P{Name}, \pL


@functools.lru_cache(maxsize=1024)
def _property_size(escape: str) -> int:
    """States of the UTF-8 byte automaton of one property escape (at least 1; one the engine refuses: 1, the parser
    reports it)."""
    from hf_paged.errors import HfPagedError
    from hf_paged.processors.automaton.byte_dfa import _outlines_byte_dfa, anchored

    try:
        return max(1, _outlines_byte_dfa(anchored(escape)).transitions.shape[0] - 1)
    except (HfPagedError, ValueError):
        return 1


def _properties_size(text: str) -> int:
    """The positions the property escapes in `text` (an escape or a class) stand for; 0 when it has none."""
    return sum(_property_size(m.group(0)) for m in _PROPERTY.finditer(text)) if "\\p" in text or "\\P" in text else 0


def _skip_class(pattern: str, i: int) -> int:
    """Index just past the `]` closing the class that starts at `pattern[i] == '['`."""
    i += 1
    if i < len(pattern) and pattern[i] == "^":
        i += 1
    if i < len(pattern) and pattern[i] == "]":  # a leading ] is a literal
        i += 1
    depth = 1
    while i < len(pattern) and depth:
        c = pattern[i]
        if c == "\\":
            i += 2
            continue
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
        i += 1
    return i


def _read_count(pattern: str, i: int) -> tuple[int, int] | None:
    """(multiplier, index after `}`) for a `{n}`, `{n,}` or `{n,m}` at `pattern[i] == '{'`, else None."""
    end = pattern.find("}", i)
    if end < 0:
        return None
    body = pattern[i + 1 : end]
    parts = body.split(",")
    if len(parts) > 2 or not all(p.strip().isdigit() or (k == 1 and p.strip() == "") for k, p in enumerate(parts)):
        return None
    low = int(parts[0])
    high = int(parts[1]) if len(parts) == 2 and parts[1].strip() else low
    return max(low, high, 1), end + 1


def estimate_regex_size(pattern: str) -> int:
    """Number of atoms `pattern` unrolls to (character classes count 1, groups multiply by their counts).

    Example:
        >>> estimate_regex_size("a{3}(bc){2}")
        7
    """
    stack = [_Group()]
    i = 0
    n = len(pattern)
    while i < n:
        c = pattern[i]
        top = stack[-1]
        if c == "\\":
            found = _PROPERTY.match(pattern, i)
            size = _property_size(found.group(0)) if found else 1
            i = found.end() if found else i + 2
            top.last = size
            top.total += size
            continue
        if c == "[":
            end = _skip_class(pattern, i)
            size = max(1, _properties_size(pattern[i:end]))
            i = end
            top.last = size
            top.total += size
            continue
        if c == "(":
            stack.append(_Group())
            i += 1
            if pattern.startswith("?", i):  # (?:, (?i) flags: skip to ':' or ')'
                j = i
                while j < n and pattern[j] not in ":)":
                    j += 1
                if j < n and pattern[j] == ")":  # a bare flag group like (?i) holds nothing
                    stack.pop()
                i = j + 1
            continue
        if c == ")":
            if len(stack) > 1:
                inner = stack.pop()
                stack[-1].last = inner.total
                stack[-1].total += inner.total
            i += 1
            continue
        if c == "{":
            count = _read_count(pattern, i)
            if count is not None:
                multiplier, i = count
                top.total += top.last * (multiplier - 1)
                top.last *= multiplier
                continue
        if c in "*+?|":
            i += 1
            continue
        top.last = 1
        top.total += 1
        i += 1
    while len(stack) > 1:  # unbalanced: let the real parser report it
        inner = stack.pop()
        stack[-1].total += inner.total
    return stack[0].total
