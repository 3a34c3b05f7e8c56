"""States that every string of body bytes keeps alive: a free-form key's prefixes, whatever names they may spell.

A free-form (undeclared) key is a complement trie of the declared names beside them (`schema.objects`): after
`"na` the key may still become `name` (a declared member) or go on as a free key. Each prefix is a state of its
own, none of them loops, so `string_steps` (one step state per body) finds no body, and a key's first visit walked
the vocabulary trie (0.3-7 ms). But every prefix takes every key character, and lands on another prefix:

    closed(B)   the largest set C of states inside a rule such that every byte of B leads from C into C

From a state of C every string of B bytes stays alive, so its mask is the plan row of all body tokens of B
(`string_masks`, per vocabulary) plus the tokens holding another byte (a quote, a backslash, non-ASCII: ~1k of
GPT-2's 50k) walked one by one on the rule's table (`walk_kernel.walk_tokens`), on past a stop on call stacks
(`past_stops`). C is the greatest fixed point, found backwards: start from the states that fail B themselves
(a dead or stop next state) and remove every predecessor through a B byte, once, in a compiled loop
(O(states x |B|)).
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.jit import kernel, warm_up

__all__ = ["closed_states"]


def _closed_numpy(table, inside, dead, columns):
    """`_closed` in whole-array steps (the uncompiled phase): drop failing states until nothing changes."""
    following = table[:, columns]
    ok = inside & (np.arange(table.shape[0]) != dead) & (following != dead).all(axis=1) & inside[following].all(axis=1)
    while True:
        kept = ok & ok[following].all(axis=1)
        if np.array_equal(kept, ok):
            return ok
        ok = kept


@kernel(python=_closed_numpy)
def _closed(table, inside, dead, columns):  # pragma: no cover (compiled)
    num_states = table.shape[0]
    num_columns = columns.shape[0]
    ok = np.zeros(num_states, np.bool_)
    num_preds = np.zeros(num_states + 1, np.int64)
    for state in range(num_states):  # (a run of body bytes into one state counts once: bytes of a class are
        ok[state] = inside[state] and state != dead  # neighbours, so a row has few runs; repeats are harmless)
        previous = -1
        for c in range(num_columns):
            following = table[state, columns[c]]
            if following == dead or not inside[following]:
                ok[state] = False
            if following != previous:
                num_preds[following + 1] += 1
                previous = following
    for state in range(num_states):  # predecessors of each state through a body byte (CSR)
        num_preds[state + 1] += num_preds[state]
    preds = np.empty(num_preds[num_states], np.int64)
    filled = num_preds[:num_states].copy()
    for state in range(num_states):
        previous = -1
        for c in range(num_columns):
            following = table[state, columns[c]]
            if following != previous:
                preds[filled[following]] = state
                filled[following] += 1
                previous = following
    stack = np.empty(num_states, np.int64)
    top = 0
    for state in range(num_states):
        if not ok[state]:
            stack[top] = state
            top += 1
    while top > 0:  # a state with a body byte into a removed state is removed in turn
        top -= 1
        state = stack[top]
        for i in range(num_preds[state], num_preds[state + 1]):
            before = preds[i]
            if ok[before]:
                ok[before] = False
                stack[top] = before
                top += 1
    return ok


def closed_states(table: np.ndarray, inside: np.ndarray, dead: int, body: int) -> np.ndarray:
    """bool per state of `table` (int32 [S, 256]): every string of bytes of the ASCII set `body` (bit b = byte b)
    stays alive and `inside` from it (greatest fixed point; `dead` and non-`inside` states are never in it)."""
    columns = np.array([byte for byte in range(128) if body >> byte & 1], dtype=np.int64)
    return _closed(table, inside, dead, columns)


@warm_up
def _signatures() -> None:
    _closed.dispatcher(np.zeros((1, 256), np.int32), np.ones(1, bool), 0, np.array([0x41], dtype=np.int64))
