"""`nfa._Builder.literal_trie` as compiled helpers (for `nfa_kernel`): an alternation of 3+ literal strings (an enum,
a list of keys) as a trie whose shared prefixes share their states, built bottom-up exactly as the Python builder
builds it (children in order of first appearance, the last child first)."""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton import nfa_store_kernel as store
from hf_paged.processors.automaton import regex_tree_kernel as tree
from hf_paged.processors.automaton.nfa import MIN_TRIE, SPARSE
from hf_paged.processors.jit import helper

__all__ = ["literal_chars", "literal_trie"]


@helper
def literal_chars(node, nodes, children, r_ptr, r_lo, r_hi):  # pragma: no cover (compiled)
    """`nfa._literals`: the number of characters of an alternation whose 3+ alternatives are all literal strings
    (single code points in sequence), else -1."""
    count = nodes[node, 4]
    if count < MIN_TRIE:
        return -1
    total = 0
    for k in range(nodes[node, 3], nodes[node, 3] + count):
        child = children[k]
        if nodes[child, 0] == tree.SET:
            first, parts = k, 1
            part_list = False
        elif nodes[child, 0] == tree.SEQ:
            first, parts = nodes[child, 3], nodes[child, 4]
            part_list = True
        else:
            return -1
        for j in range(first, first + parts):
            part = children[j] if part_list else child
            rid = nodes[part, 1]
            if nodes[part, 0] != tree.SET or r_ptr[rid + 1] - r_ptr[rid] != 1 or r_lo[r_ptr[rid]] != r_hi[r_ptr[rid]]:
                return -1
        total += parts
    return total

@helper
def literal_trie(node, total, nxt, nodes, children, r_ptr, r_lo, r_hi, seqs, kinds, aux, edges, eps, chain_keys,
                  chain_values, set_keys, set_values, ctr):  # pragma: no cover (compiled)
    """`nfa._Builder.literal_trie` of the literal alternation `node` (`total` characters): children in order of
    first appearance, built bottom-up (the last child first), each node's ASCII edges as one sorted byte-range
    state and its other characters through `_char_set`."""
    size = total + 1
    cp = np.empty(size, np.int64)
    rid_of = np.empty(size, np.int64)
    first_child = np.full(size, -1, np.int64)
    last_child = np.full(size, -1, np.int64)
    next_sibling = np.full(size, -1, np.int64)
    ends = np.zeros(size, np.bool_)
    capacity = 16
    while capacity < 2 * size:
        capacity *= 2
    keys, values = np.full(capacity, -1, np.int64), np.empty(capacity, np.int64)
    num_trie = 1
    for k in range(nodes[node, 3], nodes[node, 3] + nodes[node, 4]):
        child = children[k]
        if nodes[child, 0] == tree.SET:
            first, parts, part_list = k, 1, False
        else:
            first, parts, part_list = nodes[child, 3], nodes[child, 4], True
        at = 0
        for j in range(first, first + parts):
            rid = nodes[children[j] if part_list else child, 1]
            point = r_lo[r_ptr[rid]]
            key = (at << 21) | point
            down = store.get(keys, values, key)
            if down < 0:
                down = num_trie
                num_trie += 1
                cp[down], rid_of[down] = point, rid
                if first_child[at] < 0:
                    first_child[at] = down
                else:
                    next_sibling[last_child[at]] = down
                last_child[at] = down
                store.put(keys, values, key, down)
            at = down
        ends[at] = True
    state_of = np.empty(num_trie, np.int64)
    stack = np.empty(num_trie + 1, np.int64)  # trie node * 2 + (children done)
    stack[0], top = 0, 1
    ascii_edges = np.empty((128, 3), np.int64)
    targets = np.empty(size + 2, np.int64)
    while top > 0:
        top -= 1
        at, done = stack[top] // 2, stack[top] % 2
        if done == 0:
            stack[top] = 2 * at + 1
            top += 1
            w = first_child[at]
            while w >= 0:
                stack[top] = 2 * w
                top += 1
                w = next_sibling[w]
            continue
        num_ascii, num_targets = 0, 1  # (targets[0]: the ASCII state, if any)
        w = first_child[at]
        while w >= 0:
            if cp[w] < 0x80:
                a = cp[w]
                i = num_ascii  # insertion by code point
                while i > 0 and ascii_edges[i - 1, 0] > a:
                    ascii_edges[i, 0], ascii_edges[i, 1], ascii_edges[i, 2] = (
                        ascii_edges[i - 1, 0], ascii_edges[i - 1, 1], ascii_edges[i - 1, 2])
                    i -= 1
                ascii_edges[i, 0], ascii_edges[i, 1], ascii_edges[i, 2] = a, a, state_of[w]
                num_ascii += 1
            else:
                targets[num_targets] = store.char_set(rid_of[w], state_of[w], r_ptr, r_lo, r_hi, seqs, kinds, aux, edges,
                                                 chain_keys, chain_values, set_keys, set_values, ctr)
                num_targets += 1
            w = next_sibling[w]
        first = 1
        if num_ascii:
            e = ctr[store.EDGES]
            edges[e:e + num_ascii] = ascii_edges[:num_ascii]
            ctr[store.EDGES] = e + num_ascii
            targets[0] = store.add(kinds, aux, ctr, SPARSE, e, num_ascii)
            first = 0
        if ends[at]:
            targets[num_targets] = nxt
            num_targets += 1
        state_of[at] = store.split(targets, first, num_targets - first, kinds, aux, eps, ctr)
    return state_of[0]
