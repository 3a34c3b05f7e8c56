"""Sets of code points as sorted ranges, the Unicode classes `\\d \\w \\s`, and their UTF-8 byte sequences.

A character class becomes bytes the way regex-automata (under outlines-core) compiles it: every range is split
until each piece is a product of byte ranges, one per byte of the encoding (Unicode table 3-7: no overlongs, no
surrogates, nothing past U+10FFFF):

    [U+0000-U+007F]  ->  [00-7F]
    [U+0080-U+07FF]  ->  [C2-DF][80-BF]
    [U+0800-U+FFFF]  ->  [E0][A0-BF][80-BF] | [E1-EC][80-BF][80-BF] | [ED][80-9F][80-BF] | [EE-EF][80-BF][80-BF]
    ...
"""

from __future__ import annotations

import sys
import threading
from functools import lru_cache

from hf_paged.after_fork import renew_locks_after_fork

__all__ = ["MAX_CODE_POINT", "Ranges", "category", "complement", "normalize", "utf8_sequences"]

Ranges = tuple[tuple[int, int], ...]
MAX_CODE_POINT = 0x10FFFF
_SURROGATES = (0xD800, 0xDFFF)
_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)


def normalize(ranges: list[tuple[int, int]] | Ranges) -> Ranges:
    """Sorted, merged, without surrogates (UTF-8 cannot encode them: a class never matches one)."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        if lo > hi:
            continue
        if out and lo <= out[-1][1] + 1:
            out[-1][1] = max(out[-1][1], hi)
        else:
            out.append([lo, hi])
    kept: list[tuple[int, int]] = []
    s_lo, s_hi = _SURROGATES
    for lo, hi in out:
        if lo < s_lo:
            kept.append((lo, min(hi, s_lo - 1)))
        if hi > s_hi:
            kept.append((max(lo, s_hi + 1), hi))
    return tuple(kept)


def complement(ranges: Ranges) -> Ranges:
    """Every code point not in `ranges` (which must be normalized)."""
    out, start = [], 0
    for lo, hi in ranges:
        if lo > start:
            out.append((start, lo - 1))
        start = hi + 1
    if start <= MAX_CODE_POINT:
        out.append((start, MAX_CODE_POINT))
    return normalize(out)


@lru_cache(maxsize=16)
def category(name: str, ascii_only: bool) -> Ranges:
    """`\\d`, `\\w` or `\\s` ("digit", "word", "space") with Python's Unicode definitions (str.isdecimal,
    str.isalnum + "_", str.isspace), which are Rust's `\\d` exactly and `\\w`/`\\s` nearly. The first use of a
    Unicode class scans every code point once (~0.3 s), then it is memoised."""
    if ascii_only:
        return {"digit": ((0x30, 0x39),), "word": ((0x30, 0x39), (0x41, 0x5A), (0x5F, 0x5F), (0x61, 0x7A)),
                "space": ((0x09, 0x0D), (0x20, 0x20))}[name]
    test = {"digit": str.isdecimal, "word": lambda c: c.isalnum() or c == "_", "space": str.isspace}[name]
    with _LOCK:
        out: list[tuple[int, int]] = []
        start = -1
        for cp in range(sys.maxunicode + 1):
            if test(chr(cp)):
                if start < 0:
                    start = cp
            elif start >= 0:
                out.append((start, cp - 1))
                start = -1
        if start >= 0:
            out.append((start, sys.maxunicode))
    return normalize(out)


@lru_cache(maxsize=8192)
def utf8_sequences(ranges: Ranges) -> tuple[tuple[tuple[int, int], ...], ...]:
    """The byte-range sequences that encode exactly the code points of `ranges` (normalized), in order
    (memoised: a schema's regexes repeat a few classes thousands of times)."""
    if len(ranges) == 1 and ranges[0][1] < 0x80:  # one ASCII range, the most common class
        return ((ranges[0],),)
    out: list[tuple[tuple[int, int], ...]] = []
    for lo, hi in ranges:
        stack = [(lo, hi)]
        while stack:
            lo, hi = stack.pop()
            split = _split(lo, hi)
            if split is not None:
                stack.extend(reversed(split))  # the lower part first
                continue
            a, b = chr(lo).encode(), chr(hi).encode()
            out.append(tuple(zip(a, b)))
    return tuple(out)


def _split(lo: int, hi: int) -> list[tuple[int, int]] | None:
    """Two parts of [lo, hi] when its ends differ in encoded length or in a leading byte that the range does not
    cover fully; None when [lo, hi] is already one product of byte ranges."""
    for top in (0x7F, 0x7FF, 0xFFFF):
        if lo <= top < hi:
            return [(lo, top), (top + 1, hi)]
    if hi <= 0x7F:
        return None
    for i in range(1, 4):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                return [(lo, lo | m), ((lo | m) + 1, hi)]
            if hi & m != m:
                return [(lo, (hi & ~m) - 1), (hi & ~m, hi)]
    return None
