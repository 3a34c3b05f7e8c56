"""The Python twin of `dfa_kernel.subset_construction` (see there): what runs until the compiled loop is loaded,
and the reference it is tested against (same automaton, same state numbers, same counts of work)."""

from __future__ import annotations

from itertools import pairwise

import numpy as np

__all__ = ["subset_construction_python"]

SPARSE, SPLIT, LOOK, MATCH = 0, 1, 2, 3
_START = 0


class _Over(Exception):
    """Over `max_steps` in the middle of a piece."""


def subset_construction_python(kinds, sp_ptr, spans, eps_ptr, eps_next, look, start, max_states, max_steps):
    """`dfa_kernel.subset_construction` with dictionaries and tuples (its arrays would be slow as Python); the
    reference: the compiled loop must return exactly this."""
    spans_of = [spans[sp_ptr[q]:sp_ptr[q + 1]].tolist() for q in range(len(kinds))]
    eps_of = [eps_next[eps_ptr[q]:eps_ptr[q + 1]].tolist() for q in range(len(kinds))]
    kinds_list, look_list = kinds.tolist(), look.tolist()
    steps = 0
    single: dict[int, tuple[tuple[int, ...], bool]] = {}

    def closure_of(seed: int, at_start: bool) -> tuple[tuple[int, ...], bool]:
        nonlocal steps
        out, final, stack, seen = set(), False, [(seed, False)], set()
        while stack:
            item = stack.pop()
            if item in seen:
                continue
            seen.add(item)
            state, ended = item
            kind = kinds_list[state]
            if kind == SPARSE:
                if not ended and spans_of[state]:
                    out.add(state)
            elif kind == SPLIT:
                stack.extend((t, ended) for t in eps_of[state])
            elif kind == LOOK:
                anchor, nxt = look_list[state]
                if anchor != _START:
                    stack.append((nxt, True))
                elif at_start:
                    stack.append((nxt, ended))
            elif kind == MATCH:
                final = True
        steps += len(seen)
        return tuple(sorted(out)), final

    def closure(seed: int) -> tuple[tuple[int, ...], bool]:
        found = single.get(seed)
        if found is None:
            found = single[seed] = closure_of(seed, False)
        return found

    ids: dict[tuple[tuple[int, ...], bool], int] = {((), False): -1}
    keys: list[tuple[tuple[int, ...], bool]] = []
    single_id: dict[int, int] = {}

    def intern(key: tuple[tuple[int, ...], bool]) -> int:
        found = ids.get(key)
        if found is None:
            found = ids[key] = len(keys)
            keys.append(key)
        return found

    def intern_one(seed: int) -> int:
        found = single_id.get(seed)
        if found is None:
            found = single_id[seed] = intern(closure(seed))
        return found

    def intern_many(seeds: list[int]) -> int:
        nonlocal steps
        members: set[int] = set()
        final = False
        for seed in seeds:
            own = closure(seed)
            members.update(own[0])
            final = final or own[1]
            steps += len(own[0])
            if steps > max_steps:  # (a piece of thousands of seeds: stop inside it)
                raise _Over
        return intern((tuple(sorted(members)), final))

    start_key = closure_of(start, True)
    if start_key == ((), False):
        return 0, 0, steps, np.zeros(0, np.bool_), np.zeros(1, np.int64), np.zeros((0, 3), np.int64)
    intern(start_key)
    runs: list[int] = []
    run_ptr = [0]
    finals: list[bool] = []
    status, state_id = 0, 0
    while state_id < len(keys) and status == 0:
        members, final = keys[state_id]
        finals.append(final)
        items = sorted([tuple(span) for q in members for span in spans_of[q]])
        steps += len(items) + 1
        if all(items[i][1] < items[i + 1][0] for i in range(len(items) - 1)):
            pieces = [(first, last, [nxt]) for first, last, nxt in items]
        else:
            points = sorted({first for first, _, _ in items} | {last + 1 for _, last, _ in items})
            steps += len(points)
            pieces = ((lo, end - 1, None) for lo, end in pairwise(points))
        for lo, hi, cover in pieces:
            if steps > max_steps:
                status = 2
                break
            if cover is None:  # (a piece of the sweep: every span scanned)
                steps += len(items)
                cover = sorted({nxt for first, last, nxt in items if first <= lo and hi <= last})
                if not cover:
                    continue
            try:
                runs += (lo, hi, intern_one(cover[0]) if len(cover) == 1 else intern_many(cover))
            except _Over:
                status = 2
                break
            steps += 1
        run_ptr.append(len(runs) // 3)
        state_id += 1
        if status == 0 and len(keys) > max_states:
            status = 1
        if status == 0 and steps > max_steps:
            status = 2
    return (status, len(keys), steps, np.asarray(finals, dtype=np.bool_), np.asarray(run_ptr, dtype=np.int64),
            np.asarray(runs, dtype=np.int64).reshape(-1, 3))
