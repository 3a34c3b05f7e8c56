"""The subset construction as one compiled loop (a `jit.kernel`); its Python twin (`dfa_python`) builds the same
automaton, numbers the states the same and counts the same work, so a constraint gets one outcome whichever runs.

    NFA as arrays   kinds; byte-reading states' spans (first class, last class, next), sorted, as CSR; epsilon
                    targets as CSR; look-around (anchor, next)
    closure(q)      computed once per NFA state: its byte-reading states and whether MATCH is reached;
                    steps += (state, past-the-end) pairs visited
    row of a DFA state (BFS order)
                    its members' spans, sorted; steps += their number + 1
                    disjoint      each span is a piece, its next state the seed
                    overlapping   split at every span end (steps += points); each piece: steps += spans (the
                                  count of a scan of them all; found by a sweep over the spans that began and
                                  have not ended), its seeds the next states of the spans covering it
                    before each piece: steps > max_steps -> 2 (stop); a piece -> intern(the union of its seeds'
                    closures; steps += their sizes when several, checked after each), steps += 1; a set of
                    several seeds met before gives its state again (memoised by the seed set: the union, its sort
                    and its lookup skipped, the same steps counted)
                    after the row: states discovered > max_states -> 1, steps > max_steps -> 2

Returns (status, states, steps, finals, run_ptr, runs): state s's runs are runs[run_ptr[s]:run_ptr[s + 1]], each
(first class, last class, next state or -1 dead).
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton import seed_sets_kernel as seed_sets
from hf_paged.processors.automaton.dfa_python import subset_construction_python
from hf_paged.processors.jit import helper, kernel, warm_up

__all__ = ["LOOK", "MATCH", "SPARSE", "SPLIT", "subset_construction"]

SPARSE, SPLIT, LOOK, MATCH = 0, 1, 2, 3
_START = 0  # the start-of-text anchor (`tree.START`)


@helper
def _closure(seed, at_start, kinds, sp_ptr, eps_ptr, eps_next, look, stamp, generation, stack, found):
    """Byte-reading states reached from `seed` by epsilon moves (into `found`); returns (count, final, pairs
    visited)."""  # pragma: no cover (compiled)
    stack[0] = 2 * seed
    top, count, visited, final = 1, 0, 0, False
    while top > 0:
        top -= 1
        pair = stack[top]
        if stamp[pair] == generation:
            continue
        stamp[pair] = generation
        visited += 1
        state, ended = pair // 2, pair % 2
        kind = kinds[state]
        if kind == SPARSE:
            if ended == 0 and sp_ptr[state + 1] > sp_ptr[state]:
                found[count] = state
                count += 1
        elif kind == SPLIT:
            for e in range(eps_ptr[state], eps_ptr[state + 1]):
                stack[top] = 2 * eps_next[e] + ended
                top += 1
        elif kind == LOOK:
            if look[state, 0] != _START:
                stack[top] = 2 * look[state, 1] + 1
                top += 1
            elif at_start:
                stack[top] = 2 * look[state, 1] + ended
                top += 1
        elif kind == MATCH:
            final = True
    return count, final, visited


@helper
def _hash(members, count, final):  # pragma: no cover (compiled)
    h = np.uint64(1469598103934665603) ^ np.uint64(1 if final else 0)
    for i in range(count):
        h = (h ^ np.uint64(members[i])) * np.uint64(1099511628211)
    return np.int64(h >> np.uint64(1))


@helper
def _grow(values, size):  # pragma: no cover (compiled)
    out = np.empty(max(size, 2 * values.shape[0]), values.dtype)
    out[: values.shape[0]] = values
    return out


@helper
def _grow_rows(values, size):  # pragma: no cover (compiled)
    out = np.empty((max(size, 2 * values.shape[0]), values.shape[1]), values.dtype)
    out[: values.shape[0]] = values
    return out


_SMALL = 32  # below this many values, a sort is an insertion sort in place (no allocation); above, numpy's


@helper
def _sort_small(values, count):  # pragma: no cover (compiled)
    """values[:count] sorted in place (ascending)."""
    if count > _SMALL:
        values[:count] = np.sort(values[:count])
        return
    for i in range(1, count):
        v = values[i]
        j = i
        while j > 0 and values[j - 1] > v:
            values[j] = values[j - 1]
            j -= 1
        values[j] = v


@helper
def _sort_items(items, count, ordered):  # pragma: no cover (compiled)
    """Rows items[:count] ordered by (first, last, next), stably, into ordered[:count] (grown if short)."""
    if ordered.shape[0] < count:
        ordered = np.empty((2 * count, 3), np.int64)
    if count > _SMALL:
        order = np.argsort(items[:count, 0] * (1 << 40) + items[:count, 1] * (1 << 32) + items[:count, 2],
                           kind="mergesort")
        for i in range(count):
            ordered[i, 0], ordered[i, 1], ordered[i, 2] = items[order[i], 0], items[order[i], 1], items[order[i], 2]
        return ordered
    for i in range(count):
        a, z, t = items[i, 0], items[i, 1], items[i, 2]
        j = i
        while j > 0 and (ordered[j - 1, 0] > a or (ordered[j - 1, 0] == a and (
                ordered[j - 1, 1] > z or (ordered[j - 1, 1] == z and ordered[j - 1, 2] > t)))):
            ordered[j, 0], ordered[j, 1], ordered[j, 2] = ordered[j - 1, 0], ordered[j - 1, 1], ordered[j - 1, 2]
            j -= 1
        ordered[j, 0], ordered[j, 1], ordered[j, 2] = a, z, t
    return ordered


@kernel(python=subset_construction_python)
def subset_construction(kinds, sp_ptr, spans, eps_ptr, eps_next, look, start, max_states,
                        max_steps):  # pragma: no cover (compiled; the twin above is the reference)
    num_nfa = kinds.shape[0]
    steps = 0
    # closures of single states, memoised: members in `pool`, per state (offset, length, final); offset -1: not yet
    cl_off = np.full(num_nfa, -1, np.int64)
    cl_len = np.zeros(num_nfa, np.int64)
    cl_final = np.zeros(num_nfa, np.bool_)
    pool = np.empty(max(num_nfa, 16), np.int64)
    pool_len = 0
    stamp = np.zeros(2 * num_nfa, np.int64)
    generation = 0
    stack = np.empty(2 * num_nfa + 1, np.int64)
    found = np.empty(num_nfa + 1, np.int64)
    # DFA states: members in `keys`, per state (offset, length, final), found through an open-addressing table
    key_off = np.empty(1024, np.int64)
    key_len = np.empty(1024, np.int64)
    key_final = np.empty(1024, np.bool_)
    keys = np.empty(4096, np.int64)
    keys_len = 0
    num_states = 0
    table = np.full(4096, -1, np.int64)
    single_id = np.full(num_nfa, -2, np.int64)  # DFA state of one NFA state's closure (-2: not interned yet)
    mark = np.zeros(num_nfa, np.int64)
    mark_generation = 0
    merged = np.empty(num_nfa + 1, np.int64)
    runs = np.empty((4096, 3), np.int64)
    num_runs = 0
    run_ptr = np.zeros(1025, np.int64)
    finals = np.empty(1024, np.bool_)
    items = np.empty((256, 3), np.int64)
    sorted_rows = np.empty((256, 3), np.int64)  # `items` ordered (`_sort_items`)
    bounds = np.empty(512, np.int64)  # piece boundaries of overlapping spans, then the distinct ones
    cover = np.empty(256, np.int64)
    active = np.empty(256, np.int64)  # the sweep's spans begun at or before the piece and not ended before it
    seeds = np.empty(1, np.int64)
    points = np.empty(0, np.int64)
    # sets of several seeds -> their DFA state (`single_id` for one): keys in `seed_keys`, rows (offset, length, state)
    seed_table, seed_keys, seed_rows, num_sets = np.full(1024, -1, np.int64), np.empty(1024, np.int64), np.empty(
        (256, 3), np.int64), 0
    status = 0
    generation += 1
    count, final, visited = _closure(start, True, kinds, sp_ptr, eps_ptr, eps_next, look, stamp, generation, stack,
                                     found)
    steps += visited
    if count == 0 and not final:
        return 0, 0, steps, np.zeros(0, np.bool_), np.zeros(1, np.int64), np.zeros((0, 3), np.int64)
    members = np.sort(found[:count])
    if count > keys.shape[0]:
        keys = _grow(keys, count)
    keys[:count] = members
    keys_len = count
    key_off[0], key_len[0], key_final[0] = 0, count, final
    num_states = 1
    table[_hash(members, count, final) & (table.shape[0] - 1)] = 0
    state_id = 0
    while state_id < num_states and status == 0:
        off, size = key_off[state_id], key_len[state_id]
        finals[state_id] = key_final[state_id]
        num_items = 0
        for i in range(off, off + size):
            q = keys[i]
            for e in range(sp_ptr[q], sp_ptr[q + 1]):
                if num_items == items.shape[0]:
                    items = _grow_rows(items, 2 * num_items)
                items[num_items, 0] = spans[e, 0]
                items[num_items, 1] = spans[e, 1]
                items[num_items, 2] = spans[e, 2]
                num_items += 1
        steps += num_items + 1
        sorted_rows = _sort_items(items, num_items, sorted_rows)
        ordered = sorted_rows[:num_items]
        disjoint = True
        for i in range(num_items - 1):
            if ordered[i, 1] >= ordered[i + 1, 0]:
                disjoint = False
                break
        # pieces: (first, last, number of seeds) with the seeds in `cover`
        if disjoint:
            num_pieces = num_items
        else:
            if bounds.shape[0] < 2 * num_items:
                bounds = np.empty(4 * num_items, np.int64)
            bounds[:num_items] = ordered[:, 0]
            bounds[num_items:2 * num_items] = ordered[:, 1] + 1
            _sort_small(bounds, 2 * num_items)
            num_points = 0
            for i in range(2 * num_items):
                if num_points == 0 or bounds[i] != bounds[num_points - 1]:
                    bounds[num_points] = bounds[i]
                    num_points += 1
            points = bounds[:num_points]
            num_pieces = num_points - 1
            steps += num_points
            if active.shape[0] < num_items:
                active = np.empty(2 * num_items, np.int64)
        num_active, entered = 0, 0  # (the sweep over overlapping spans: `active[:num_active]`, spans entered)
        for piece in range(num_pieces):
            if steps > max_steps:
                status = 2
                break
            if disjoint:
                lo, hi = ordered[piece, 0], ordered[piece, 1]
                num_seeds = 1
                seeds[0] = ordered[piece, 2]
                chosen = seeds
            else:
                lo, hi = points[piece], points[piece + 1] - 1
                steps += num_items  # (counted as a scan of every span: the same work whichever way it is found)
                num_seeds = 0
                mark_generation += 1
                # A sweep, not a scan: spans enter in their order (by first class) once they begin at or before
                # `lo` and leave once they end before it (pieces ascend); the spans covering the piece are among
                # those left, in span order as a scan meets them
                while entered < num_items and ordered[entered, 0] <= lo:
                    active[num_active] = entered
                    num_active += 1
                    entered += 1
                kept = 0
                for a in range(num_active):
                    i = active[a]
                    if ordered[i, 1] < lo:
                        continue
                    active[kept] = i
                    kept += 1
                    if hi <= ordered[i, 1]:
                        nxt = ordered[i, 2]
                        if mark[nxt] != mark_generation:
                            mark[nxt] = mark_generation
                            if num_seeds == cover.shape[0]:
                                cover = _grow(cover, 2 * num_seeds)
                            cover[num_seeds] = nxt
                            num_seeds += 1
                num_active = kept
                if num_seeds == 0:
                    continue
                _sort_small(cover, num_seeds)
                chosen = cover[:num_seeds]
            seed_slot, seed_entry = -1, -1
            if num_seeds > 1:
                seed_slot, seed_entry = seed_sets.find(seed_table, seed_keys, seed_rows, chosen, num_seeds)
            if num_seeds == 1 and single_id[chosen[0]] != -2:
                target = single_id[chosen[0]]
            elif seed_entry >= 0:  # merged before: the same state, the same steps (every seed's closure is known)
                for j in range(num_seeds):
                    steps += cl_len[chosen[j]]
                    if steps > max_steps:
                        status = 2
                        break
                if status != 0:
                    break
                target = seed_rows[seed_entry, 2]
            else:
                # the closures of the seeds (each memoised), merged
                mark_generation += 1
                num_members, final = 0, False
                for j in range(num_seeds):
                    seed = chosen[j]
                    if cl_off[seed] < 0:
                        generation += 1
                        count, own_final, visited = _closure(seed, False, kinds, sp_ptr, eps_ptr, eps_next, look,
                                                             stamp, generation, stack, found)
                        steps += visited
                        if pool_len + count > pool.shape[0]:
                            pool = _grow(pool, pool_len + count)
                        _sort_small(found, count)
                        pool[pool_len:pool_len + count] = found[:count]
                        cl_off[seed], cl_len[seed], cl_final[seed] = pool_len, count, own_final
                        pool_len += count
                    final = final or cl_final[seed]
                    for i in range(cl_off[seed], cl_off[seed] + cl_len[seed]):
                        member = pool[i]
                        if mark[member] != mark_generation:
                            mark[member] = mark_generation
                            merged[num_members] = member
                            num_members += 1
                    if num_seeds > 1:
                        steps += cl_len[seed]
                        if steps > max_steps:  # (a piece of thousands of seeds: stop inside it)
                            status = 2
                            break
                if status != 0:
                    break
                _sort_small(merged, num_members)
                members = merged[:num_members]
                if num_members == 0 and not final:
                    target = -1
                else:
                    mask = table.shape[0] - 1
                    slot = _hash(members, num_members, final) & mask
                    target = -1
                    while table[slot] >= 0:
                        other = table[slot]
                        if key_len[other] == num_members and key_final[other] == final:
                            same = True
                            base = key_off[other]
                            for i in range(num_members):
                                if keys[base + i] != members[i]:
                                    same = False
                                    break
                            if same:
                                target = other
                                break
                        slot = (slot + 1) & mask
                    if target < 0:  # a new DFA state
                        target = num_states
                        if num_states == key_off.shape[0]:
                            key_off = _grow(key_off, 2 * num_states)
                            key_len = _grow(key_len, 2 * num_states)
                            key_final = _grow(key_final, 2 * num_states)
                        if keys_len + num_members > keys.shape[0]:
                            keys = _grow(keys, keys_len + num_members)
                        keys[keys_len:keys_len + num_members] = members
                        key_off[target], key_len[target], key_final[target] = keys_len, num_members, final
                        keys_len += num_members
                        table[slot] = target
                        num_states += 1
                        if 2 * num_states > table.shape[0]:  # rehash into a table twice the size
                            table = np.full(2 * table.shape[0], -1, np.int64)
                            mask = table.shape[0] - 1
                            for other in range(num_states):
                                slot = _hash(keys[key_off[other]:key_off[other] + key_len[other]], key_len[other],
                                             key_final[other]) & mask
                                while table[slot] >= 0:
                                    slot = (slot + 1) & mask
                                table[slot] = other
                if num_seeds == 1:
                    single_id[chosen[0]] = target
                else:
                    seed_table, seed_keys, seed_rows = seed_sets.remember(seed_table, seed_keys, seed_rows, num_sets,
                                                                         seed_slot, chosen, num_seeds, target)
                    num_sets += 1
            if num_runs == runs.shape[0]:
                runs = _grow_rows(runs, 2 * num_runs)
            runs[num_runs, 0], runs[num_runs, 1], runs[num_runs, 2] = lo, hi, target
            num_runs += 1
            steps += 1
        if state_id + 2 > run_ptr.shape[0]:
            run_ptr = _grow(run_ptr, 2 * (state_id + 2))
        run_ptr[state_id + 1] = num_runs
        state_id += 1
        if state_id == finals.shape[0]:
            finals = _grow(finals, 2 * state_id)
        if status == 0 and num_states > max_states:
            status = 1
        if status == 0 and steps > max_steps:
            status = 2
    return status, num_states, steps, finals[:state_id].copy(), run_ptr[:state_id + 1].copy(), runs[:num_runs].copy()


@warm_up
def _signatures() -> None:
    """A two-state automaton, in the types `dfa.determinize` passes."""
    kinds = np.array([MATCH, SPARSE], dtype=np.int8)
    sp_ptr = np.array([0, 0, 1], dtype=np.int64)
    spans = np.array([[0, 0, 0]], dtype=np.int64)
    subset_construction.dispatcher(kinds, sp_ptr, spans, np.zeros(3, np.int64), np.zeros(0, np.int64),
                                   np.zeros((2, 2), np.int64), 1, 10, 100)
