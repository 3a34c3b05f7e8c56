"""`productive`'s formula of a long rule text, read with array operations: the same formula as the token-by-token
reader (`productive._formula`), at a fraction of its cost where a text runs to tens of thousands of characters
(a recursive definition with many members: its key tries alone are thousands of groups and alternatives).

Only the groups that hold a call matter: a group, an alternative or a run without calls matches some text. So
every character is classified at once (escaped, inside a class, a group's bracket, a bar, a call's mark), the
brackets are paired by depth (a sort), the groups that hold a call picked out (counts of calls before each
position), and only those are walked, each alternative an `and` of its calls and its called groups (true where a
quantifier lets it repeat zero times), each group the `or` of its alternatives.

    text --bytes--> escaped / in a class --> live `(` `)` `|` and calls --> pairs by depth --> the groups that hold
         a call --> their alternatives' formulas, innermost first (recursion over those groups only)
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from itertools import pairwise

import numpy as np

from hf_paged.processors.automaton.call_graph import call_number

__all__ = ["formulas_from_arrays"]

_CALL = re.compile(rb"\\x02((?:\\x[0-9a-f]{2}){3})")  # a call as `call_regex` spells it
_NOTHING = rb"[^\x00-\U0010ffff]"  # `productive.NOTHING`
_CALL_LEN = 16  # its characters: the mark and three digits, each `\xHH`
_BACKSLASH, _OPEN, _CLOSE, _BAR = 92, 40, 41, 124
_SQUARE_OPEN, _SQUARE_CLOSE, _CARET, _QUESTION, _STAR, _BRACE, _ZERO, _COLON = 91, 93, 94, 63, 42, 123, 48, 58


def formulas_from_arrays(texts: list[str]) -> list | None:  # -> list[productive.Formula] | None
    """The formulas of `texts` (see `productive._formula`), read together (one pass of each array operation over
    all of them), or None for syntax this reader leaves to that one (a class that starts with `]` or holds a `[`,
    a group other than `(` or `(?:`, unbalanced brackets, the empty class)."""
    encoded = [text.encode("utf-8") for text in texts]  # (a character past ASCII is several bytes, none syntax)
    raw = b"\n".join(encoded)  # (a separator byte between texts: each text's root spans separator to separator)
    if _NOTHING in raw:
        return None  # (the empty class is false: the token reader's)
    b = np.frombuffer(raw, dtype=np.uint8)
    n = b.shape[0]
    ends = np.cumsum([len(part) + 1 for part in encoded]) - 1  # each text's separator (or the end)
    # escaped characters: after a backslash that is not escaped itself (an even place in its run of backslashes);
    # positions are sparse arrays from here on: full-length temporaries cost page faults on a loaded machine
    slashes = np.flatnonzero(b == _BACKSLASH)
    if slashes.shape[0]:
        run_start = np.ones(slashes.shape[0], dtype=bool)
        run_start[1:] = slashes[1:] != slashes[:-1] + 1
        index = np.arange(slashes.shape[0])
        first = np.maximum.accumulate(np.where(run_start, index, 0))
        escaped = slashes[((index - first) & 1) == 0] + 1  # (the characters the run's escaping backslashes escape)
    else:
        escaped = slashes
    is_escaped = np.zeros(n + 1, dtype=bool)
    is_escaped[escaped] = True

    def unescaped(byte: int) -> np.ndarray:
        found = np.flatnonzero(b == byte)
        return found[~is_escaped[found]]

    opens, closes = unescaped(_SQUARE_OPEN), unescaped(_SQUARE_CLOSE)
    if opens.shape[0] != closes.shape[0]:
        return None
    if opens.shape[0]:
        if np.any(closes <= opens) or np.any(opens[1:] <= closes[:-1]):
            return None  # (a `[` or `]` inside a class: nested classes, or a literal `]` first)
        if np.any(np.searchsorted(ends, opens) != np.searchsorted(ends, closes)):
            return None  # (a class across texts: one that does not close)
        after = b[np.minimum(opens + 1, n - 1)]
        if np.any(after == _SQUARE_CLOSE) or np.any((after == _CARET) & (b[np.minimum(opens + 2, n - 1)] ==
                                                                           _SQUARE_CLOSE)):
            return None

    def outside_classes(found: np.ndarray) -> np.ndarray:
        if not opens.shape[0] or not found.shape[0]:
            return found
        before = np.searchsorted(opens, found) - 1  # (the last class opened before)
        inside = (before >= 0) & (closes[np.maximum(before, 0)] > found)
        return found[~inside]

    group_opens = outside_classes(unescaped(_OPEN))
    group_closes = outside_classes(unescaped(_CLOSE))
    if group_opens.shape[0] != group_closes.shape[0]:
        return None
    if group_opens.shape[0]:
        modifier = b[np.minimum(group_opens + 1, n - 1)] == _QUESTION
        if np.any(modifier & (b[np.minimum(group_opens + 2, n - 1)] != _COLON)):
            return None  # (named groups, flags, look-around: the token reader's)

    def depth(at: np.ndarray) -> np.ndarray:
        """Groups open at positions `at` (a bracket itself: an opener counts, a closer does not)."""
        return np.searchsorted(group_opens, at, "right") - np.searchsorted(group_closes, at, "right")

    if group_closes.shape[0] and (np.any(depth(group_closes) < 0) or np.any(depth(ends - 1) != 0)):
        return None  # (brackets that do not balance within each text)
    # calls: their starts, numbers and depths
    call_at = []
    call_numbers = []
    for match in _CALL.finditer(raw):
        number = call_number(match.group(1).decode("ascii"))
        if number is not None:
            call_at.append(match.start())
            call_numbers.append(number)
    if not call_at:
        return [True] * len(texts)
    call_pos = np.asarray(call_at, dtype=np.int64)
    real = ~is_escaped[call_pos]  # (a mark whose backslash is escaped, or inside a class, is text, not a call)
    if opens.shape[0]:
        before = np.searchsorted(opens, call_pos) - 1
        real &= (before < 0) | (closes[np.maximum(before, 0)] < call_pos)
    if not real.all():
        call_pos, call_numbers = call_pos[real], [k for k, keep in zip(call_numbers, real.tolist()) if keep]
        if not call_numbers:
            return [True] * len(texts)
    # groups: brackets paired by (level, position); keep the ones with a call inside
    brackets = np.concatenate([group_opens, group_closes])
    merged = np.argsort(brackets, kind="stable")  # (two sorted runs: a linear merge)
    brackets = brackets[merged]
    closing = merged >= group_opens.shape[0]
    level = np.cumsum(np.where(closing, -1, 1)) + closing  # (an opener's level is the depth after it, a closer's before)
    order = np.argsort(level.astype(np.int16), kind="stable")  # (by level, then position: a radix sort)
    paired = brackets[order].reshape(-1, 2)
    group_level = level[order][::2]
    holds = np.searchsorted(call_pos, paired[:, 1]) - np.searchsorted(call_pos, paired[:, 0]) > 0
    groups = paired[holds]
    levels = group_level[holds]
    call_level = depth(call_pos)
    bars = outside_classes(unescaped(_BAR))
    bar_level = depth(bars)
    calls_sorted = call_pos.tolist()

    def optional_after(end: int) -> bool:
        """Whether a quantifier right after position `end` allows zero copies (`*`, `?`, `{0,..}`, `{0}`)."""
        at = end + 1
        if at >= n:
            return False
        if b[at] == _STAR or b[at] == _QUESTION:
            return True
        return bool(b[at] == _BRACE and at + 2 < n and b[at + 1] == _ZERO and b[at + 2] in (44, 125))

    by_level: dict[int, tuple[list[int], tuple[list[int], list[int]], list[int], list[int]]] = {}

    def at_level(lvl: int):
        hit = by_level.get(lvl)
        if hit is None:
            keep = levels == lvl + 1  # (the groups whose brackets sit at this depth: their insides one deeper)
            calls_here = (call_level == lvl).tolist()
            hit = by_level[lvl] = (
                bars[bar_level == lvl].tolist(), (groups[keep, 0].tolist(), groups[keep, 1].tolist()),
                [at for at, here in zip(calls_sorted, calls_here) if here],
                [number for number, here in zip(call_numbers, calls_here) if here])
        return hit

    def node(start: int, end: int, lvl: int):  # the alternatives between positions start and end (exclusive)
        level_bars, level_groups, level_calls, level_numbers = at_level(lvl)
        bounds = [start, *level_bars[bisect_right(level_bars, start) : bisect_left(level_bars, end)], end]
        alternatives = []
        for left, right in pairwise(bounds):
            if bisect_left(calls_sorted, right) == bisect_right(calls_sorted, left):
                return True  # (an alternative without a call: some text)
            items = []
            for k in range(bisect_right(level_calls, left), bisect_left(level_calls, right)):
                items.append(True if optional_after(level_calls[k] + _CALL_LEN - 1) else level_numbers[k])
            group_starts, group_ends = level_groups
            for k in range(bisect_right(group_starts, left), bisect_left(group_starts, right)):
                items.append(True if optional_after(group_ends[k]) else node(group_starts[k], group_ends[k], lvl + 1))
            alternatives.append(all_of(items))
        return any_of(alternatives)

    return [node(start, end, 0) for start, end in zip([-1, *ends[:-1].tolist()], ends.tolist())]


def all_of(items: list):
    """A formula's conjunction, simplified (True / False absorbed, one item alone)."""
    return _joined(items, "&", absorbing=False)


def any_of(items: list):
    """A formula's disjunction, simplified (True / False absorbed, one item alone)."""
    return _joined(items, "|", absorbing=True)


def _joined(items: list, op: str, absorbing: bool):
    kept = []
    for item in items:
        if item is absorbing:
            return absorbing
        if item is not (not absorbing):  # the identity drops out
            kept.append(item)
    return (not absorbing) if not kept else kept[0] if len(kept) == 1 else (op, tuple(kept))
