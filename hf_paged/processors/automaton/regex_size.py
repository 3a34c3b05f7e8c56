"""A cheap upper-bound-ish estimate of how many positions a regex expands to once counted repetitions unroll.

regex-automata (under outlines-core) builds its NFA and DFA without a size limit, so `a{99999999}` or nested
`(x{100}){100}` exhausts memory before any error. Counting unrolled atoms in Python first lets us refuse such a
pattern with `SchemaTooComplexError` in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["estimate_regex_size"]


@dataclass(slots=True)
class _Group:
    total: int = 0  # unrolled size of the current alternative(s) of this group
    last: int = 0  # size of the most recent atom, which a following quantifier multiplies


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
            i += 2
            top.last = 1
            top.total += 1
            continue
        if c == "[":
            i = _skip_class(pattern, i)
            top.last = 1
            top.total += 1
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
