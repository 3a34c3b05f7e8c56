"""Sets of code points in compiled helpers (for `regex_tree_kernel` and `nfa_store_kernel`): `charsets.py`'s
normalize, complement and UTF-8 sequences over arrays, and one id per distinct set.

    a set       pairs lo[:n], hi[:n], normalized as `charsets.normalize` (sorted, merged, no surrogates)
    interned    `r_ptr[id]:r_ptr[id + 1]` into `r_lo` / `r_hi`: equal sets share an id (as equal tuples share the
                Python NFA builder's memo entries)
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton.charsets import MAX_CODE_POINT
from hf_paged.processors.jit import helper

__all__ = ["MAX_SEQUENCES", "complement", "intern", "normalize", "utf8_sequences"]

MAX_SEQUENCES = 28  # UTF-8 byte-range sequences one code point range can need (4 lengths x 7 pieces)
_SURROGATE_LO, _SURROGATE_HI = 0xD800, 0xDFFF


@helper
def normalize(lo, hi, n, out_lo, out_hi):  # pragma: no cover (compiled)
    """`charsets.normalize` of the pairs lo[:n], hi[:n] (sorted in place) into out_*; returns their number."""
    for i in range(1, n):  # insertion sort by (lo, hi): classes are short
        a, b = lo[i], hi[i]
        j = i
        while j > 0 and (lo[j - 1] > a or (lo[j - 1] == a and hi[j - 1] > b)):
            lo[j], hi[j] = lo[j - 1], hi[j - 1]
            j -= 1
        lo[j], hi[j] = a, b
    merged = 0
    for i in range(n):
        if lo[i] > hi[i]:
            continue
        if merged and lo[i] <= hi[merged - 1] + 1:
            hi[merged - 1] = max(hi[merged - 1], hi[i])
        else:
            lo[merged], hi[merged] = lo[i], hi[i]
            merged += 1
    count = 0
    for i in range(merged):
        if lo[i] < _SURROGATE_LO:
            out_lo[count], out_hi[count] = lo[i], min(hi[i], _SURROGATE_LO - 1)
            count += 1
        if hi[i] > _SURROGATE_HI:
            out_lo[count], out_hi[count] = max(lo[i], _SURROGATE_HI + 1), hi[i]
            count += 1
    return count

@helper
def complement(lo, hi, n, out_lo, out_hi):  # pragma: no cover (compiled)
    """`charsets.complement` of normalized lo[:n], hi[:n] (normalized again) into out_*; returns their number."""
    count, start = 0, 0
    for i in range(n):
        if lo[i] > start:
            out_lo[count], out_hi[count] = start, lo[i] - 1
            count += 1
        start = hi[i] + 1
    if start <= MAX_CODE_POINT:
        out_lo[count], out_hi[count] = start, MAX_CODE_POINT
        count += 1
    lo[:count], hi[:count] = out_lo[:count], out_hi[:count]
    return normalize(lo, hi, count, out_lo, out_hi)

@helper
def intern(set_lo, set_hi, n, r_ptr, r_lo, r_hi, num_ranges, table):  # pragma: no cover (compiled)
    """The id of the set set_lo[:n], set_hi[:n] (added when new). Returns (id, number of sets)."""
    h = np.uint64(1469598103934665603) ^ np.uint64(n)
    for i in range(n):
        h = (h ^ np.uint64(set_lo[i])) * np.uint64(1099511628211)
        h = (h ^ np.uint64(set_hi[i])) * np.uint64(1099511628211)
    mask = table.shape[0] - 1
    slot = np.int64(h >> np.uint64(1)) & mask
    while table[slot] >= 0:
        other = table[slot]
        base = r_ptr[other]
        if r_ptr[other + 1] - base == n:
            same = True
            for i in range(n):
                if r_lo[base + i] != set_lo[i] or r_hi[base + i] != set_hi[i]:
                    same = False
                    break
            if same:
                return other, num_ranges
        slot = (slot + 1) & mask
    base = r_ptr[num_ranges]
    r_lo[base:base + n] = set_lo[:n]
    r_hi[base:base + n] = set_hi[:n]
    r_ptr[num_ranges + 1] = base + n
    table[slot] = num_ranges
    return num_ranges, num_ranges + 1


@helper
def _utf8(cp, out):  # pragma: no cover (compiled)
    """The UTF-8 bytes of `cp` into out; returns their number."""
    if cp < 0x80:
        out[0] = cp
        return 1
    if cp < 0x800:
        out[0], out[1] = 0xC0 | (cp >> 6), 0x80 | (cp & 0x3F)
        return 2
    if cp < 0x10000:
        out[0], out[1], out[2] = 0xE0 | (cp >> 12), 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)
        return 3
    out[0], out[1] = 0xF0 | (cp >> 18), 0x80 | ((cp >> 12) & 0x3F)
    out[2], out[3] = 0x80 | ((cp >> 6) & 0x3F), 0x80 | (cp & 0x3F)
    return 4

@helper
def utf8_sequences(r_lo, r_hi, first, last, seqs):  # pragma: no cover (compiled)
    """`charsets.utf8_sequences` of the ranges first..last-1: rows (length, lo0, hi0, ..., lo3, hi3) in order."""
    count = 0
    stack = np.empty((2 * MAX_SEQUENCES, 2), np.int64)
    a, b = np.empty(4, np.int64), np.empty(4, np.int64)
    for r in range(first, last):
        stack[0, 0], stack[0, 1] = r_lo[r], r_hi[r]
        top = 1
        while top > 0:
            top -= 1
            lo, hi = stack[top, 0], stack[top, 1]
            cut = -1  # (lo, cut) and (cut + 1, hi), the lower part first (`charsets._split`)
            for boundary in (0x7F, 0x7FF, 0xFFFF):
                if lo <= boundary < hi:
                    cut = boundary
                    break
            if cut < 0 and hi > 0x7F:
                for i in range(1, 4):
                    m = (1 << (6 * i)) - 1
                    if lo & ~m != hi & ~m:
                        if lo & m:
                            cut = lo | m
                            break
                        if hi & m != m:
                            cut = (hi & ~m) - 1
                            break
            if cut >= 0:
                stack[top, 0], stack[top, 1] = cut + 1, hi
                stack[top + 1, 0], stack[top + 1, 1] = lo, cut
                top += 2
                continue
            length = _utf8(lo, a)
            _utf8(hi, b)
            seqs[count, 0] = length
            for k in range(length):
                seqs[count, 1 + 2 * k], seqs[count, 2 + 2 * k] = a[k], b[k]
            count += 1
    return count
