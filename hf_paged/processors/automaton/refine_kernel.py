"""Moore's partition refinement, stopped after k rounds, as one compiled loop (a `jit.kernel`) with a numpy twin;
what `index.state_classes.lookahead_classes` runs (see there for what the classes mean).

    columns    bytes every state sends alike are one column (a JSON rule has ~30-90 distinct ones, not 256)
    round      a state's signature: (its class, the class each column leads to); equal signatures, one class (a
               state alone in its class stays alone: it takes the next number without a signature)
    stop       a round that splits nothing (every later round is the same), or nearly every state alone

Both return the same partition: the compiled loop hashes signatures into an open-addressing table and checks
every hit exactly; the twin sorts integer hashes and checks them exactly too. The caller numbers the classes (in
order of first appearance), so the two give the same array.
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.jit import kernel, warm_up

__all__ = ["refine_classes", "refine_classes_python"]

_SEED = 20261129  # the twin's hash weights: fixed, drawn per call (no generator shared between compiling threads)
_FNV_OFFSET, _FNV_PRIME = 1469598103934665603, 1099511628211


def refine_classes_python(table, initial, rounds):
    """The numpy twin (and the reference): classes of `table`'s states after at most `rounds` rounds, starting
    from the partition `initial` (int64 [S], classes 0..n-1); `arange(S)` when nearly every state is alone."""
    num_states = table.shape[0]
    columns = _distinct_columns(table)
    classes = initial
    num_classes = int(classes.max()) + 1
    # integer hashes (uint64, wrapping): equal signatures always hash alike, which float products do not promise
    weights = np.random.default_rng(_SEED).integers(1, 2**63, size=columns.shape[1] + 1, dtype=np.uint64)
    for _ in range(rounds):
        own = classes.astype(np.uint64)
        after = own[columns]  # [S, columns]: the class each byte column leads to
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


@kernel(python=refine_classes_python)
def refine_classes(table, initial, rounds):  # pragma: no cover (compiled; the twin above is the reference)
    num_states, width = table.shape
    # distinct columns: a hash per column (rows read in order), then exact checks within equal hashes
    column_hash = np.full(width, np.uint64(_FNV_OFFSET))
    for s in range(num_states):
        for b in range(width):
            column_hash[b] = (column_hash[b] ^ np.uint64(table[s, b])) * np.uint64(_FNV_PRIME)
    keep = np.empty(width, np.int64)
    num_columns = 0
    for b in range(width):
        seen = False
        for k in range(num_columns):
            c = keep[k]
            if column_hash[c] == column_hash[b]:
                same = True
                for s in range(num_states):
                    if table[s, c] != table[s, b]:
                        same = False
                        break
                if same:
                    seen = True
                    break
        if not seen:
            keep[num_columns] = b
            num_columns += 1
    columns = np.empty((num_states, num_columns), np.int64)
    for s in range(num_states):
        for k in range(num_columns):
            columns[s, k] = table[s, keep[k]]
    classes = initial.copy()
    num_classes = 0
    for s in range(num_states):
        num_classes = max(num_classes, classes[s] + 1)
    size = 1
    while size < 2 * num_states:
        size *= 2
    slot_state = np.empty(size, np.int64)
    slot_hash = np.empty(size, np.uint64)
    refined = np.empty(num_states, np.int64)
    members = np.zeros(num_states, np.int64)  # states per class (a class of one stays alone: no signature to hash)
    for _ in range(rounds):
        slot_state[:] = -1
        members[:num_classes] = 0
        for s in range(num_states):
            members[classes[s]] += 1
        count = 0
        for s in range(num_states):
            if members[classes[s]] == 1:
                refined[s] = count  # (its own class again: no other state shares its old class, so none its new one)
                count += 1
                continue
            h = (np.uint64(_FNV_OFFSET) ^ np.uint64(classes[s])) * np.uint64(_FNV_PRIME)
            for k in range(num_columns):
                h = (h ^ np.uint64(classes[columns[s, k]])) * np.uint64(_FNV_PRIME)
            h ^= h >> np.uint64(29)
            i = np.int64(h & np.uint64(size - 1))
            while True:
                other = slot_state[i]
                if other < 0:
                    slot_state[i] = s
                    slot_hash[i] = h
                    refined[s] = count
                    count += 1
                    break
                if slot_hash[i] == h and classes[other] == classes[s]:
                    same = True
                    for k in range(num_columns):
                        if classes[columns[other, k]] != classes[columns[s, k]]:
                            same = False
                            break
                    if same:
                        refined[s] = refined[other]
                        break
                i = (i + 1) & (size - 1)
        if count == num_classes:
            break
        classes[:] = refined
        num_classes = count
        if num_classes * 10 > num_states * 9:
            return np.arange(num_states, dtype=np.int64)
    return classes


@warm_up
def _signatures() -> None:
    """A two-state rule table, in the types `index.state_classes.lookahead_classes` passes."""
    refine_classes.dispatcher(np.zeros((2, 256), np.int32), np.zeros(2, np.int64), 16)
