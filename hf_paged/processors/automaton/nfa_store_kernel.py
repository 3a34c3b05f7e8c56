"""The NFA under construction in compiled helpers (for `nfa_kernel` and `literal_trie_kernel`): states and
their edges in growable arrays, two memo tables, and `nfa._Builder`'s `char_set` and `split`.

    kinds [S] / aux [S, 2]   a state's kind and (offset, count) of its edges (LOOK: anchor, next)
    edges [E, 3]             (first byte, last byte, next) of byte-reading states
    eps [X]                  epsilon targets of split states
    ctr                      counters: states, edges, epsilon targets, chain and set memo entries
    memo tables              open addressing (keys -1: empty), a load under one half: (set id, next) -> the set's
                             first state; (next, lo, hi) -> a one-range chain state (shared UTF-8 suffixes)

The caller reserves room before each step (`fit`, `fit_rows`, `fit_map`), so no helper grows an array.
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton import charset_kernel as charsets
from hf_paged.processors.automaton.nfa import SPARSE, SPLIT
from hf_paged.processors.jit import helper

__all__ = ["CHAINS", "COUNT", "EDGES", "EPS", "SETS", "add", "char_set", "fit", "fit_map", "fit_rows", "get", "put",
           "split"]

COUNT, EDGES, EPS, CHAINS, SETS = 0, 1, 2, 3, 4  # the counters in `ctr`


@helper
def _slot(key, mask):  # pragma: no cover (compiled)
    return np.int64((np.uint64(key) * np.uint64(0x9E3779B97F4A7C15)) >> np.uint64(24)) & mask

@helper
def get(keys, values, key):  # pragma: no cover (compiled)
    mask = keys.shape[0] - 1
    slot = _slot(key, mask)
    while keys[slot] != -1:
        if keys[slot] == key:
            return values[slot]
        slot = (slot + 1) & mask
    return -1

@helper
def put(keys, values, key, value):  # pragma: no cover (compiled)
    mask = keys.shape[0] - 1
    slot = _slot(key, mask)
    while keys[slot] != -1:
        slot = (slot + 1) & mask
    keys[slot], values[slot] = key, value

@helper
def fit_map(keys, values, size, need):  # pragma: no cover (compiled)
    """The map with room for `need` more keys at a load under one half (rehashed into a bigger table if not)."""
    if 2 * (size + need) <= keys.shape[0]:
        return keys, values
    capacity = keys.shape[0]
    while 2 * (size + need) > capacity:
        capacity *= 2
    new_keys, new_values = np.full(capacity, -1, np.int64), np.empty(capacity, np.int64)
    for slot in range(keys.shape[0]):
        if keys[slot] != -1:
            put(new_keys, new_values, keys[slot], values[slot])
    return new_keys, new_values

@helper
def fit(values, size):  # pragma: no cover (compiled)
    """`values` with room for `size` entries (a copy twice as big, or bigger, when short)."""
    if size <= values.shape[0]:
        return values
    out = np.empty(max(size, 2 * values.shape[0]), values.dtype)
    out[: values.shape[0]] = values
    return out

@helper
def fit_rows(values, size):  # pragma: no cover (compiled)
    """`_fit` of a 2-D array's rows."""
    if size <= values.shape[0]:
        return values
    out = np.empty((max(size, 2 * values.shape[0]), values.shape[1]), values.dtype)
    out[: values.shape[0]] = values
    return out

@helper
def add(kinds, aux, ctr, kind, a, b):  # pragma: no cover (compiled)
    """A new state (room reserved); for SPARSE / SPLIT, (a, b) is (offset, count) of its edges."""
    state = ctr[COUNT]
    kinds[state], aux[state, 0], aux[state, 1] = kind, a, b
    ctr[COUNT] = state + 1
    return state

@helper
def char_set(rid, nxt, r_ptr, r_lo, r_hi, seqs, kinds, aux, edges, chain_keys, chain_values, set_keys, set_values,
              ctr):  # pragma: no cover (compiled)
    """`nfa._Builder.char_set`: one code point of the set `rid`, then `nxt` (memoised per (set, next))."""
    key = (rid << 32) | nxt
    state = get(set_keys, set_values, key)
    if state >= 0:
        return state
    first, last = r_ptr[rid], r_ptr[rid + 1]
    if last - first == 1 and r_hi[first] < 0x80:  # one ASCII range: one byte range
        e = ctr[EDGES]
        edges[e, 0], edges[e, 1], edges[e, 2] = r_lo[first], r_hi[first], nxt
        ctr[EDGES] = e + 1
        state = add(kinds, aux, ctr, SPARSE, e, 1)
    else:
        count = charsets.utf8_sequences(r_lo, r_hi, first, last, seqs)
        for s in range(count):  # each sequence's tail as a chain of one-range states (shared suffixes)
            after = nxt
            for k in range(seqs[s, 0] - 1, 0, -1):
                lo, hi = seqs[s, 1 + 2 * k], seqs[s, 2 + 2 * k]
                chain = (after << 16) | (lo << 8) | hi
                shared = get(chain_keys, chain_values, chain)
                if shared < 0:
                    e = ctr[EDGES]
                    edges[e, 0], edges[e, 1], edges[e, 2] = lo, hi, after
                    ctr[EDGES] = e + 1
                    shared = add(kinds, aux, ctr, SPARSE, e, 1)
                    put(chain_keys, chain_values, chain, shared)
                    ctr[CHAINS] += 1
                after = shared
            seqs[s, 0] = after  # (the sequence's first range leads here)
        e = ctr[EDGES]
        for s in range(count):
            edges[e + s, 0], edges[e + s, 1], edges[e + s, 2] = seqs[s, 1], seqs[s, 2], seqs[s, 0]
        ctr[EDGES] = e + count
        state = add(kinds, aux, ctr, SPARSE, e, count)
    put(set_keys, set_values, key, state)
    ctr[SETS] += 1
    return state

@helper
def split(targets, first, count, kinds, aux, eps, ctr):  # pragma: no cover (compiled)
    """`nfa._Builder.split`: the one target itself, or a new split state over targets[first:first + count]."""
    if count == 1:
        return targets[first]
    x = ctr[EPS]
    eps[x:x + count] = targets[first:first + count]
    ctr[EPS] = x + count
    return add(kinds, aux, ctr, SPLIT, x, count)
