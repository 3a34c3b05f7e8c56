"""The subset construction's array steps before and after its loop, each one compiled loop (a `jit.kernel`) with
a numpy twin (a few dozen numpy calls whatever the size: what a small automaton costs until the loops load). Both
versions give the same arrays.

    nfa_layout    the NFA's byte ranges -> byte classes (bytes no range tells apart share one: a range's first
                  byte and the byte after its last start a class); each byte-reading state's spans (first class,
                  last class, next) sorted, as CSR; epsilon targets as CSR
    live_states   the states from which a final one can be reached (a walk backwards over predecessor lists)
    trim_table    keep the states from which a match can be reached (the finals, and every state with an edge
                  into a kept one), renumbered in order, and write the dense byte table [K + 1, 256] int32 (row K
                  the dead state); a run of classes is a run of bytes (classes are contiguous byte ranges, in order)
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.jit import helper, kernel, warm_up

__all__ = ["live_states", "nfa_layout", "trim_table"]


def nfa_layout_python(kinds, sparse, counts, flat, split, eps_counts):
    """The numpy twin (and the reference): (sp_ptr, spans, eps_ptr, byte_class) of an NFA of len(kinds) states
    whose byte-reading states `sparse` have `counts` ranges each, `flat` [E, 3] (first byte, last byte, next) in
    their order, and whose split states `split` have `eps_counts` targets each."""
    starts = np.zeros(257, dtype=np.bool_)
    starts[0] = True
    starts[flat[:, 0]] = True
    starts[flat[:, 1] + 1] = True
    byte_class = np.cumsum(starts[:256]) - 1
    owner = np.repeat(sparse, counts)
    first, last, nxt = byte_class[flat[:, 0]], byte_class[flat[:, 1]], flat[:, 2]
    order = np.lexsort((nxt, last, first, owner))  # each state's spans sorted, states in order
    spans = np.ascontiguousarray(np.stack([first, last, nxt], axis=1)[order])
    per_state = np.zeros(kinds.shape[0], dtype=np.int64)
    per_state[sparse] = counts
    sp_ptr = np.concatenate((np.zeros(1, np.int64), np.cumsum(per_state)))
    per_state[:] = 0
    per_state[split] = eps_counts
    eps_ptr = np.concatenate((np.zeros(1, np.int64), np.cumsum(per_state)))
    return sp_ptr, spans.reshape(-1, 3), eps_ptr, byte_class


@kernel(python=nfa_layout_python)
def nfa_layout(kinds, sparse, counts, flat, split, eps_counts):  # pragma: no cover (compiled; twin: reference)
    starts = np.zeros(257, np.bool_)
    starts[0] = True
    for e in range(flat.shape[0]):
        starts[flat[e, 0]] = True
        starts[flat[e, 1] + 1] = True
    byte_class = np.empty(256, np.int64)
    c = -1
    for b in range(256):
        if starts[b]:
            c += 1
        byte_class[b] = c
    num_states = kinds.shape[0]
    sp_ptr = np.zeros(num_states + 1, np.int64)
    for j in range(sparse.shape[0]):
        sp_ptr[sparse[j] + 1] = counts[j]
    for q in range(num_states):
        sp_ptr[q + 1] += sp_ptr[q]
    spans = np.empty((flat.shape[0], 3), np.int64)
    e = 0
    for j in range(sparse.shape[0]):
        base = sp_ptr[sparse[j]]
        for k in range(counts[j]):  # insertion sort of the state's spans by (first, last, next)
            a, z, t = byte_class[flat[e, 0]], byte_class[flat[e, 1]], flat[e, 2]
            e += 1
            i = base + k
            while i > base and (spans[i - 1, 0] > a or (spans[i - 1, 0] == a and (
                    spans[i - 1, 1] > z or (spans[i - 1, 1] == z and spans[i - 1, 2] > t)))):
                spans[i, 0], spans[i, 1], spans[i, 2] = spans[i - 1, 0], spans[i - 1, 1], spans[i - 1, 2]
                i -= 1
            spans[i, 0], spans[i, 1], spans[i, 2] = a, z, t
    eps_ptr = np.zeros(num_states + 1, np.int64)
    for j in range(split.shape[0]):
        eps_ptr[split[j] + 1] = eps_counts[j]
    for q in range(num_states):
        eps_ptr[q + 1] += eps_ptr[q]
    return sp_ptr, spans, eps_ptr, byte_class


def live_states_python(pred_ptr, preds, finals):
    """`live_states` as a Python walk over lists (what runs until the compiled loop is loaded)."""
    pred_list, starts, live = preds.tolist(), pred_ptr.tolist(), finals.tolist()
    stack = [state for state, final in enumerate(live) if final]
    while stack:  # one step per edge, however long the chains
        state = stack.pop()
        for before in pred_list[starts[state] : starts[state + 1]]:
            if not live[before]:
                live[before] = True
                stack.append(before)
    return np.asarray(live, dtype=np.bool_)


@helper
def _walk_back(pred_ptr, preds, finals):  # pragma: no cover (compiled)
    live = finals.copy()
    stack = np.empty(finals.shape[0], np.int64)
    top = 0
    for state in range(finals.shape[0]):
        if live[state]:
            stack[top] = state
            top += 1
    while top > 0:
        top -= 1
        state = stack[top]
        for i in range(pred_ptr[state], pred_ptr[state + 1]):
            before = preds[i]
            if not live[before]:
                live[before] = True
                stack[top] = before
                top += 1
    return live


@kernel(python=live_states_python)
def live_states(pred_ptr, preds, finals):  # pragma: no cover (compiled; the twin above is the reference)
    """bool [S]: the states from which a final one can be reached (predecessors of state s: preds[pred_ptr[s]:
    pred_ptr[s + 1]])."""
    return _walk_back(pred_ptr, preds, finals)


def trim_table_python(runs, run_ptr, finals, byte_class):
    """The numpy twin (and the reference)."""
    num_states = finals.shape[0]
    run_state = np.repeat(np.arange(num_states, dtype=np.int64), np.diff(run_ptr))
    target = runs[:, 2]
    linked = target >= 0
    pairs = np.unique(target[linked] * num_states + run_state[linked])  # (to, from), each edge once, sorted by `to`
    preds = pairs % num_states
    starts = np.searchsorted(pairs // num_states, np.arange(num_states + 1))
    kept = live_states(starts, preds, finals)  # backwards from the finals
    if not kept[0]:
        return False, np.zeros((0, 256), np.int32), np.zeros(0, np.bool_)
    renumber = np.full(num_states + 1, -1, dtype=np.int64)  # (index -1, a dead target, stays -1)
    renumber[:-1][kept] = np.arange(int(kept.sum()))
    dead = int(kept.sum())
    rows, nexts = renumber[run_state], renumber[target]
    use = (rows >= 0) & (nexts >= 0)
    class_start = np.flatnonzero(np.diff(byte_class, prepend=-1))
    class_end = np.append(class_start[1:], 256) - 1
    first_byte, last_byte = class_start[runs[use, 0]], class_end[runs[use, 1]]
    lengths = last_byte - first_byte + 1
    offsets = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    table = np.full((dead + 1, 256), dead, dtype=np.int32)
    table[np.repeat(rows[use], lengths), np.repeat(first_byte, lengths) + offsets] = np.repeat(nexts[use], lengths)
    return True, table, np.append(finals[kept], False)


@kernel(python=trim_table_python)
def trim_table(runs, run_ptr, finals, byte_class):  # pragma: no cover (compiled; the twin above is the reference)
    num_states = finals.shape[0]
    # predecessors as CSR (an edge per run; repeats only cost a second look)
    counts = np.zeros(num_states + 1, np.int64)
    for s in range(num_states):
        for r in range(run_ptr[s], run_ptr[s + 1]):
            if runs[r, 2] >= 0:
                counts[runs[r, 2] + 1] += 1
    for s in range(num_states):
        counts[s + 1] += counts[s]
    preds = np.empty(counts[num_states], np.int64)
    fill = counts[:-1].copy()
    for s in range(num_states):
        for r in range(run_ptr[s], run_ptr[s + 1]):
            t = runs[r, 2]
            if t >= 0:
                preds[fill[t]] = s
                fill[t] += 1
    live = _walk_back(counts, preds, finals)
    if not live[0]:
        return False, np.zeros((0, 256), np.int32), np.zeros(0, np.bool_)
    renumber = np.full(num_states, -1, np.int64)
    dead = 0
    for s in range(num_states):
        if live[s]:
            renumber[s] = dead
            dead += 1
    class_start = np.empty(257, np.int64)  # class c covers bytes class_start[c] .. class_start[c + 1] - 1
    num_classes = 0
    for b in range(256):
        if b == 0 or byte_class[b] != byte_class[b - 1]:
            class_start[num_classes] = b
            num_classes += 1
    class_start[num_classes] = 256
    table = np.full((dead + 1, 256), dead, np.int32)
    out_finals = np.zeros(dead + 1, np.bool_)
    for s in range(num_states):
        row = renumber[s]
        if row < 0:
            continue
        out_finals[row] = finals[s]
        for r in range(run_ptr[s], run_ptr[s + 1]):
            t = runs[r, 2]
            if t >= 0 and renumber[t] >= 0:
                for b in range(class_start[runs[r, 0]], class_start[runs[r, 1] + 1]):
                    table[row, b] = renumber[t]
    return True, table, out_finals


@warm_up
def _signatures() -> None:
    """A one-state automaton, in the types `dfa.determinize` passes."""
    nfa_layout.dispatcher(np.array([0], np.int8), np.zeros(1, np.int64), np.ones(1, np.int64),
                          np.zeros((1, 3), np.int64), np.zeros(0, np.int64), np.zeros(0, np.int64))
    live_states.dispatcher(np.zeros(3, np.int64), np.zeros(0, np.int64), np.zeros(2, np.bool_))
    trim_table.dispatcher(np.zeros((1, 3), np.int64), np.array([0, 1], np.int64), np.ones(1, np.bool_),
                          np.zeros(256, np.int64))
