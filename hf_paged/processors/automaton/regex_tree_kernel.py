"""Regex text -> a regex tree in arrays, as one compiled helper of `nfa_kernel` (the fast reader's syntax only).

It reads exactly what `syntax._parse_fast` reads, token by token, and builds the same tree: the same nodes in the
same shape, so the NFA built from it is the one `nfa.build_nfa` builds from `syntax.parse`. Anything the fast
reader hands to Python's parser (or rejects) makes it give up (`ok` False), and the caller takes the Python path.

    codes        int32 [n]: the regex's code points
    nodes        int64 [N, 5]: (kind, a, b, first child, number of children)
                     SET   a = its code point ranges' id
                     SEQ / ALT   children in `children`
                     REP   a = lo, b = hi (-1: unbounded), one child
                     LOOK  a = START | END
    ranges       sets of code points, normalized as `charsets.normalize` (sorted, merged, no surrogates), one id
                 per distinct set (`r_ptr` into `r_lo` / `r_hi`): equal sets share an id, as equal tuples share
                 the NFA builder's memo entries
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton import charset_kernel as charsets
from hf_paged.processors.automaton.charsets import MAX_CODE_POINT
from hf_paged.processors.jit import helper

__all__ = ["ALT", "LOOK", "REP", "SEQ", "SET", "parse_arrays"]

SET, SEQ, ALT, REP, LOOK = 0, 1, 2, 3, 4
_START, _END = 0, 1  # (`tree.START`, `tree.END`)


@helper
def _is_literal(c):  # pragma: no cover (compiled)
    """`syntax._TOKEN`'s `lit` characters: [A-Za-z0-9 "'!%,/:;<=>@_`~&-]."""
    return ((48 <= c <= 57) or (65 <= c <= 90) or (97 <= c <= 122) or c == 32 or c == 34 or c == 39 or c == 33
            or c == 37 or c == 44 or c == 47 or c == 58 or c == 59 or c == 60 or c == 61 or c == 62 or c == 64
            or c == 95 or c == 96 or c == 126 or c == 38 or c == 45)

@helper
def _is_punct(c):  # pragma: no cover (compiled)
    """ASCII punctuation, escaped as itself: [!-/:-@\\[-`{-~]."""
    return (33 <= c <= 47) or (58 <= c <= 64) or (91 <= c <= 96) or (123 <= c <= 126)

@helper
def _control(c):  # pragma: no cover (compiled)
    """The code point of `\\n \\t \\r \\f \\v \\a` by its letter, else -1."""
    if c == 110:
        return 10
    if c == 116:
        return 9
    if c == 114:
        return 13
    if c == 102:
        return 12
    if c == 118:
        return 11
    if c == 97:
        return 7
    return -1

@helper
def _hex_digit(c):  # pragma: no cover (compiled)
    if 48 <= c <= 57:
        return c - 48
    if 65 <= c <= 70:
        return c - 55
    if 97 <= c <= 102:
        return c - 87
    return -1

@helper
def _hex_escape(codes, p, end):  # pragma: no cover (compiled)
    """The escape at codes[p] (the letter after the backslash): `x41`, `u0041`, `U00000041` or `x{41}`.
    Returns (code point, position after it); code point -1: not one (or past U+10FFFF: the fast reader bails)."""
    letter = codes[p]
    width = 2 if letter == 120 else 4 if letter == 117 else 8 if letter == 85 else 0
    if width == 0:
        return -1, p
    if p + width < end:
        value = 0
        for k in range(p + 1, p + 1 + width):
            d = _hex_digit(codes[k])
            if d < 0:
                value = -1
                break
            value = value * 16 + d
        if value >= 0:
            return (value if value <= MAX_CODE_POINT else -1), p + 1 + width
    if p + 1 < end and codes[p + 1] == 123:  # braced: 1 to 8 digits
        value, k = 0, p + 2
        while k < end and k < p + 10 and _hex_digit(codes[k]) >= 0:
            value = value * 16 + _hex_digit(codes[k])
            k += 1
        if k > p + 2 and k < end and codes[k] == 125:
            return (value if value <= MAX_CODE_POINT else -1), k + 1
    return -1, p

@helper
def _class_set(codes, start, end, lo, hi, out_lo, out_hi):  # pragma: no cover (compiled)
    """`syntax._class_ranges` of the class body codes[start:end] (between the brackets) into out_*; returns the
    number of ranges, or -1 where the fast reader bails (or the class is Rust-only syntax)."""
    negate = start < end and codes[start] == 94
    if negate:
        start += 1
    num_items, p = 0, start
    while p < end:  # items: a code point, or -2 for a range dash
        c = codes[p]
        if c == 92:
            e = codes[p + 1]  # (the class token never ends on a lone backslash)
            value = _control(e)
            after = p + 2
            if value < 0 and _is_punct(e):
                value = e
            elif value < 0:
                value, after = _hex_escape(codes, p + 1, end)
                if value < 0:
                    return -1
            lo[num_items] = value
            p = after
        else:
            if c == 91:
                return -1  # a nested class (Rust reads `[` inside a class as one)
            if (c == 38 or c == 45 or c == 126) and p + 1 < end and codes[p + 1] == c:
                return -1  # class set operations
            lo[num_items] = -2 if (c == 45 and num_items > 0 and p + 1 < end) else c
            p += 1
        num_items += 1
    count, i = 0, 0
    while i < num_items:
        first = lo[i]
        if first == -2:
            return -1
        if i + 2 < num_items and lo[i + 1] == -2 and lo[i + 2] != -2:
            last = lo[i + 2]
            if last < first or last > MAX_CODE_POINT:
                return -1
            out_lo[count], out_hi[count] = first, last
            i += 3
        else:
            out_lo[count], out_hi[count] = first, first
            i += 1
        count += 1
    if count == 0 and not negate:
        return -1
    lo[:count], hi[:count] = out_lo[:count], out_hi[:count]
    count = charsets.normalize(lo, hi, count, out_lo, out_hi)
    if negate:
        lo[:count], hi[:count] = out_lo[:count], out_hi[:count]
        count = charsets.complement(lo, hi, count, out_lo, out_hi)
    return count

@helper
def _add_node(nodes, num_nodes, kind, a, b, first, count):  # pragma: no cover (compiled)
    nodes[num_nodes, 0], nodes[num_nodes, 1], nodes[num_nodes, 2] = kind, a, b
    nodes[num_nodes, 3], nodes[num_nodes, 4] = first, count
    return num_nodes + 1

@helper
def _group(items, num_items, alt_starts, first_alt, num_alts, nodes, num_nodes, children, num_children, alt_nodes,
           empty):  # pragma: no cover (compiled)
    """`syntax._group` of the alternatives alt_starts[first_alt:num_alts] (each runs to the next one's start, the
    last to num_items). Returns (its node, number of nodes, number of children)."""
    count = num_alts - first_alt
    for k in range(count):
        lo = alt_starts[first_alt + k]
        hi = alt_starts[first_alt + k + 1] if k + 1 < count else num_items
        if hi - lo == 1:
            alt_nodes[k] = items[lo]
        elif hi == lo:
            alt_nodes[k] = empty
        else:
            children[num_children:num_children + hi - lo] = items[lo:hi]
            alt_nodes[k] = num_nodes
            num_nodes = _add_node(nodes, num_nodes, SEQ, 0, 0, num_children, hi - lo)
            num_children += hi - lo
    if count == 1:
        return alt_nodes[0], num_nodes, num_children
    children[num_children:num_children + count] = alt_nodes[:count]
    node = num_nodes
    num_nodes = _add_node(nodes, num_nodes, ALT, 0, 0, num_children, count)
    return node, num_nodes, num_children + count

@helper
def _number(codes, p, end):  # pragma: no cover (compiled)
    """The decimal digits at codes[p:]: (value, position after them); value -1 when there are none or more than
    18 (a count no budget lets through: the Python path reports it)."""
    value, q = 0, p
    while q < end and 48 <= codes[q] <= 57:
        if q - p == 18:
            return -1, q
        value = value * 10 + codes[q] - 48
        q += 1
    return (value if q > p else -1), q

@helper
def parse_arrays(codes):  # pragma: no cover (compiled)
    """The tree of the regex `codes` (see the module docstring). Returns (ok, root, nodes, children, r_ptr, r_lo,
    r_hi); ok False: the fast reader would bail (the caller parses in Python)."""
    n = codes.shape[0]
    cap = 4 * n + 16
    nodes = np.empty((cap, 5), np.int64)
    children = np.empty(cap, np.int64)
    items = np.empty(n + 2, np.int64)
    alt_starts = np.empty(n + 2, np.int64)
    alt_nodes = np.empty(n + 2, np.int64)
    group_starts = np.empty(n + 2, np.int64)
    r_ptr = np.zeros(n + 8, np.int64)
    r_lo = np.empty(3 * n + 16, np.int64)
    r_hi = np.empty(3 * n + 16, np.int64)
    size = 16
    while size < 2 * (n + 8):
        size *= 2
    table = np.full(size, -1, np.int64)
    lo = np.empty(n + 8, np.int64)
    hi = np.empty(n + 8, np.int64)
    out_lo = np.empty(n + 8, np.int64)
    out_hi = np.empty(n + 8, np.int64)
    num_ranges, num_nodes, num_children, num_items = 0, 0, 0, 0
    empty = 0
    num_nodes = _add_node(nodes, num_nodes, SEQ, 0, 0, 0, 0)
    lo[0], hi[0] = 10, 10
    count = charsets.complement(lo, hi, 1, out_lo, out_hi)
    dot, num_ranges = charsets.intern(out_lo, out_hi, count, r_ptr, r_lo, r_hi, num_ranges, table)
    alt_starts[0], num_alts = 0, 1
    group_starts[0], num_groups = 0, 1
    p = 0
    while p < n:
        c = codes[p]
        point = -1  # a one-character node to push
        if _is_literal(c) or c >= 128:
            point = c
            p += 1
        elif c == 92:
            if p + 1 >= n:
                return False, 0, nodes, children, r_ptr, r_lo, r_hi
            e = codes[p + 1]
            if _is_punct(e):
                point = e
                p += 2
            elif _control(e) >= 0:
                point = _control(e)
                p += 2
            else:
                point, p = _hex_escape(codes, p + 1, n)
                if point < 0:
                    return False, 0, nodes, children, r_ptr, r_lo, r_hi
        elif c == 91:
            q = p + 1
            if q < n and codes[q] == 94:
                q += 1
            if q < n and codes[q] == 93:
                q += 1
            while q < n and codes[q] != 93:
                q += 2 if codes[q] == 92 else 1
            if q >= n:
                return False, 0, nodes, children, r_ptr, r_lo, r_hi
            count = _class_set(codes, p + 1, q, lo, hi, out_lo, out_hi)
            if count < 0:
                return False, 0, nodes, children, r_ptr, r_lo, r_hi
            rid, num_ranges = charsets.intern(out_lo, out_hi, count, r_ptr, r_lo, r_hi, num_ranges, table)
            items[num_items] = num_nodes
            num_items += 1
            num_nodes = _add_node(nodes, num_nodes, SET, rid, 0, 0, 0)
            p = q + 1
        elif c == 40:
            p += 3 if (p + 2 < n and codes[p + 1] == 63 and codes[p + 2] == 58) else 1
            group_starts[num_groups] = num_alts
            num_groups += 1
            alt_starts[num_alts] = num_items
            num_alts += 1
        elif c == 41:
            if num_groups == 1:
                return False, 0, nodes, children, r_ptr, r_lo, r_hi
            num_groups -= 1
            first_alt = group_starts[num_groups]
            node, num_nodes, num_children = _group(items, num_items, alt_starts, first_alt, num_alts, nodes,
                                                   num_nodes, children, num_children, alt_nodes, empty)
            num_items, num_alts = alt_starts[first_alt], first_alt
            if nodes[node, 0] == REP or nodes[node, 0] == LOOK:
                children[num_children] = node
                node = num_nodes
                num_nodes = _add_node(nodes, num_nodes, SEQ, 0, 0, num_children, 1)
                num_children += 1
            items[num_items] = node
            num_items += 1
            p += 1
        elif c == 124:
            alt_starts[num_alts] = num_items
            num_alts += 1
            p += 1
        elif c == 42 or c == 43 or c == 63 or c == 123:
            if c == 123:
                low, q = _number(codes, p + 1, n)
                if low < 0:
                    return False, 0, nodes, children, r_ptr, r_lo, r_hi
                high = low
                if q < n and codes[q] == 44:
                    high, q = _number(codes, q + 1, n)
                    if high < 0 and q < n and 48 <= codes[q] <= 57:
                        return False, 0, nodes, children, r_ptr, r_lo, r_hi  # (more than 18 digits)
                    if 0 <= high < low:
                        return False, 0, nodes, children, r_ptr, r_lo, r_hi
                if q >= n or codes[q] != 125:
                    return False, 0, nodes, children, r_ptr, r_lo, r_hi
                q += 1
            else:
                low, high, q = (0, -1, p + 1) if c == 42 else (1, -1, p + 1) if c == 43 else (0, 1, p + 1)
            if q < n and codes[q] == 63:
                q += 1
            if num_items == alt_starts[num_alts - 1]:
                return False, 0, nodes, children, r_ptr, r_lo, r_hi
            child = items[num_items - 1]
            if nodes[child, 0] == REP or nodes[child, 0] == LOOK:
                return False, 0, nodes, children, r_ptr, r_lo, r_hi
            children[num_children] = child
            items[num_items - 1] = num_nodes
            num_nodes = _add_node(nodes, num_nodes, REP, low, high, num_children, 1)
            num_children += 1
            p = q
        elif c == 46:
            items[num_items] = num_nodes
            num_items += 1
            num_nodes = _add_node(nodes, num_nodes, SET, dot, 0, 0, 0)
            p += 1
        elif c == 94 or c == 36:
            items[num_items] = num_nodes
            num_items += 1
            num_nodes = _add_node(nodes, num_nodes, LOOK, _START if c == 94 else _END, 0, 0, 0)
            p += 1
        else:
            return False, 0, nodes, children, r_ptr, r_lo, r_hi
        if point >= 0:
            lo[0], hi[0] = point, point
            count = charsets.normalize(lo, hi, 1, out_lo, out_hi)
            rid, num_ranges = charsets.intern(out_lo, out_hi, count, r_ptr, r_lo, r_hi, num_ranges, table)
            items[num_items] = num_nodes
            num_items += 1
            num_nodes = _add_node(nodes, num_nodes, SET, rid, 0, 0, 0)
    if num_groups != 1:
        return False, 0, nodes, children, r_ptr, r_lo, r_hi
    root, num_nodes, num_children = _group(items, num_items, alt_starts, 0, num_alts, nodes, num_nodes, children,
                                           num_children, alt_nodes, empty)
    return True, root, nodes, children, r_ptr, r_lo, r_hi
