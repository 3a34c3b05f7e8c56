"""States that no string of at most k bytes can tell apart: the classes behind masks shared by states of a counter.

A counted pattern (`maxLength` with a word pattern, `{0,29}` repetitions) names a state per count, and decoding
meets a new one at nearly every token. But a token is at most a few bytes long: two states whose walks agree on
every string of at most k bytes (both dead or both alive after each byte, and at the same stop state whenever
one of them reaches a stop) allow the same tokens of at most k bytes, and hand the same (node, stop state) pairs
over to whatever decides beyond the stops. That is Moore's partition refinement stopped after k rounds:

    round 0    dead | each stop state alone | every other state
    round r+1  same class at round r, and for every byte the same class of next state at round r

k = 16 leaves 72 of GPT-2's 50k tokens longer (`grammar_masks` walks those per state). Bytes that every state
sends alike are one column (a JSON string's pattern has ~30 byte columns, not 256), and a round compares rows by
a hash checked exactly (`automaton/refine_kernel.py`: a compiled loop, a numpy twin until it loads).
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.automaton.refine_kernel import refine_classes

__all__ = ["LOOKAHEAD", "lookahead_classes"]

LOOKAHEAD = 16  # bytes of lookahead the classes answer for


def lookahead_classes(table: np.ndarray, dead: int, stops: np.ndarray, rounds: int = LOOKAHEAD) -> np.ndarray:
    """Class of every state of `table` (int32 [S, 256]) under the walks of at most `rounds` bytes.

    Args:
        table: next state per (state, byte).
        dead: the dead state (its own class).
        stops: bool [S]: states where a walk hands over (each its own class: a call, a finished callee).
        rounds: the lookahead in bytes.

    Returns:
        int64 [S], numbered in order of first appearance: equal classes mean the same alive/dead outcome and the
        same stop states met, at the same depths, for every string of at most `rounds` bytes.
    """
    num_states = table.shape[0]
    color = np.zeros(num_states, dtype=np.int64)
    color[stops] = np.arange(1, int(stops.sum()) + 1)
    color[dead] = -1
    _, initial = np.unique(color, return_inverse=True)
    # (the compiled refinement once loaded, its numpy twin until then: the same partition, numbered alike here)
    classes = refine_classes(np.ascontiguousarray(table, dtype=np.int32), initial.reshape(-1).astype(np.int64),
                             int(rounds))
    _, first, inverse = np.unique(classes, return_index=True, return_inverse=True)
    order = np.empty(first.shape[0], dtype=np.int64)
    order[np.argsort(first, kind="stable")] = np.arange(first.shape[0])
    return order[inverse.reshape(-1)]
