"""The subset construction's memo of seed sets (`dfa_kernel`): a piece of a DFA row whose spans lead to several NFA
states (its seeds) becomes the DFA state of the union of their closures; the same seed set gives the same state, so
its state is found again by the seeds alone (two or three numbers) instead of merging the closures (tens), sorting
the union and looking it up. Compiled helpers (`jit.helper`) of that kernel.

    seed_table   int64 [2^k]      open addressing: entry number or -1, kept at most half full
    seed_keys    int64            every entry's seeds, sorted, one entry after another
    seed_rows    int64 [n, 3]     per entry: (offset in seed_keys, number of seeds, DFA state)
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.jit import helper

__all__ = ["find", "remember"]


@helper
def _hash(values, count):  # pragma: no cover (compiled)
    h = np.uint64(1469598103934665603)
    for i in range(count):
        h = (h ^ np.uint64(values[i])) * np.uint64(1099511628211)
    return np.int64(h >> np.uint64(1))


@helper
def find(seed_table, seed_keys, seed_rows, chosen, num_seeds):  # pragma: no cover (compiled)
    """(slot, entry) of the seed set chosen[:num_seeds] (sorted): entry -1 when absent, slot then its place."""
    mask = seed_table.shape[0] - 1
    slot = _hash(chosen, num_seeds) & mask
    while seed_table[slot] >= 0:
        entry = seed_table[slot]
        if seed_rows[entry, 1] == num_seeds:
            base = seed_rows[entry, 0]
            same = True
            for i in range(num_seeds):
                if seed_keys[base + i] != chosen[i]:
                    same = False
                    break
            if same:
                return slot, entry
        slot = (slot + 1) & mask
    return slot, -1


@helper
def remember(seed_table, seed_keys, seed_rows, num_sets, slot, chosen, num_seeds, target):  # pragma: no cover
    """Seed set chosen[:num_seeds] -> DFA state `target`, as entry `num_sets` at `slot` (what `find` said); returns
    the three arrays (grown, the table rehashed twice as big once half full)."""
    if num_sets == seed_rows.shape[0]:
        grown = np.empty((2 * num_sets, 3), np.int64)
        grown[:num_sets] = seed_rows
        seed_rows = grown
    off = 0 if num_sets == 0 else seed_rows[num_sets - 1, 0] + seed_rows[num_sets - 1, 1]
    if off + num_seeds > seed_keys.shape[0]:
        grown_keys = np.empty(2 * (off + num_seeds), np.int64)
        grown_keys[:off] = seed_keys[:off]
        seed_keys = grown_keys
    seed_keys[off:off + num_seeds] = chosen[:num_seeds]
    seed_rows[num_sets, 0], seed_rows[num_sets, 1], seed_rows[num_sets, 2] = off, num_seeds, target
    seed_table[slot] = num_sets
    if 2 * (num_sets + 1) > seed_table.shape[0]:
        seed_table = np.full(2 * seed_table.shape[0], -1, np.int64)
        mask = seed_table.shape[0] - 1
        for entry in range(num_sets + 1):
            base, size = seed_rows[entry, 0], seed_rows[entry, 1]
            slot = _hash(seed_keys[base:base + size], size) & mask
            while seed_table[slot] >= 0:
                slot = (slot + 1) & mask
            seed_table[slot] = entry
    return seed_table, seed_keys, seed_rows
