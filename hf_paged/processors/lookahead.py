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
a random-weight hash checked exactly against each class's first member.
"""

from __future__ import annotations

import numpy as np

__all__ = ["LOOKAHEAD", "lookahead_classes"]

LOOKAHEAD = 16  # bytes of lookahead the classes answer for

_SEED = 20261129  # hash weights: fixed, drawn per call (no generator shared between compiling threads)


def lookahead_classes(table: np.ndarray, dead: int, stops: np.ndarray, rounds: int = LOOKAHEAD) -> np.ndarray:
    """Class of every state of `table` (int32 [S, 256]) under the walks of at most `rounds` bytes.

    Args:
        table: next state per (state, byte).
        dead: the dead state (its own class).
        stops: bool [S]: states where a walk hands over (each its own class: a call, a finished callee).
        rounds: the lookahead in bytes.

    Returns:
        int64 [S]: equal classes mean the same alive/dead outcome and the same stop states met, at the same
        depths, for every string of at most `rounds` bytes.
    """
    num_states = table.shape[0]
    columns = _distinct_columns(table)
    color = np.zeros(num_states, dtype=np.int64)
    color[stops] = np.arange(1, int(stops.sum()) + 1)
    color[dead] = -1
    _, classes = np.unique(color, return_inverse=True)
    num_classes = int(classes.max()) + 1
    weights = np.random.default_rng(_SEED).random(columns.shape[1] + 1)  # float hashes: one BLAS product a round (collisions: checked)
    for _ in range(rounds):
        own = classes.astype(np.float64)
        after = own[columns]  # [S, columns]: the class each byte column leads to (floats: one BLAS product)
        _, first, refined = np.unique(own * weights[0] + after @ weights[1:], return_index=True, return_inverse=True)
        refined = refined.reshape(-1)
        model = first[refined]
        if not ((own == own[model]).all() and (after == after[model]).all()):  # a hash collision merged two
            rows = np.concatenate([classes[:, None], classes[columns]], axis=1)  # classes: sort the rows
            _, refined = np.unique(rows, axis=0, return_inverse=True)
            refined = refined.reshape(-1)
        if int(refined.max()) + 1 == num_classes:
            break  # stable: every further round is the same partition
        classes, num_classes = refined, int(refined.max()) + 1
        if num_classes * 10 > num_states * 9:  # nearly every state alone already: no class worth the next rounds
            return np.arange(num_states, dtype=np.int64)  # (a finer partition shares less, never wrongly)
    return classes


def _distinct_columns(table: np.ndarray) -> np.ndarray:
    """The distinct byte columns of `table` ([S, C]: bytes every state sends alike kept once)."""
    weights = np.random.default_rng(_SEED + 1).random(table.shape[0], dtype=np.float32)
    _, first, inverse = np.unique(weights @ table.astype(np.float32), return_index=True, return_inverse=True)
    columns = table[:, first]
    if not (columns[:, inverse.reshape(-1)] == table).all():  # a hash collision: keep every column (exact)
        return table
    return columns
