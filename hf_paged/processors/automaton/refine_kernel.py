"""Moore's partition refinement, stopped after k rounds, as one compiled loop (a `jit.kernel`) with a numpy twin;
what `index.state_classes.lookahead_classes` runs (see there for what the classes mean).

    columns    bytes every state sends alike are one column (a JSON rule has ~30-90 distinct ones, not 256)
    round      a state's signature: (its class, the class each column leads to); equal signatures, one class (a
               state alone in its class stays alone)
    stop       a round that splits nothing (every later round is the same), or nearly every state alone

Both return the same partition: the compiled loop hashes signatures into an open-addressing table and checks
every hit exactly; the twin sorts integer hashes and checks them exactly too. The compiled loop splits only the
classes that can split: after the first round, those with a member whose successor moved to a new class in the
round before (members of a class agree on their successors' classes; a successor that did not move still
agrees), found through predecessor lists. The caller numbers the classes (in
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
    same_as = np.empty(width, np.int64)  # the first earlier column of an equal hash, or the column itself
    for b in range(width):
        same_as[b] = b
        for c in range(b):
            if same_as[c] == c and column_hash[c] == column_hash[b]:
                same_as[b] = c
                break
    for s in range(num_states):  # equal hashes checked exactly, rows read in order (a column-wise check would miss
        for b in range(width):  # the cache at every state); a collision keeps its column
            c = same_as[b]
            if c != b and c >= 0 and table[s, c] != table[s, b]:
                same_as[b] = -1
    keep = np.empty(width, np.int64)
    num_columns = 0
    for b in range(width):
        if same_as[b] == b or same_as[b] < 0:
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
    # predecessors over the distinct columns (CSR): a class can split next round only if a member's successor
    # moved to a new class this round (members agreed on every successor's class, and unmoved ones still agree)
    pred_ptr = np.zeros(num_states + 1, np.int64)
    for s in range(num_states):  # (a run of columns into one state counts once; repeats would be harmless)
        previous = -1
        for k in range(num_columns):
            if columns[s, k] != previous:
                previous = columns[s, k]
                pred_ptr[previous + 1] += 1
    for t in range(num_states):
        pred_ptr[t + 1] += pred_ptr[t]
    fill = pred_ptr[:-1].copy()
    preds = np.empty(pred_ptr[num_states], np.int32)
    for s in range(num_states):
        previous = -1
        for k in range(num_columns):
            t = columns[s, k]
            if t != previous:
                preds[fill[t]] = s
                fill[t] += 1
                previous = t
    size = 1
    while size < 2 * num_states:
        size *= 2
    slot_state = np.empty(size, np.int64)
    slot_hash = np.empty(size, np.uint64)
    slot_stamp = np.zeros(size, np.int64)
    stamp = 0
    refined = np.empty(num_states, np.int64)
    class_size = np.zeros(num_states + 1, np.int64)
    class_start = np.zeros(num_states + 1, np.int64)
    order = np.empty(num_states, np.int64)
    candidate = np.ones(num_states, np.bool_)  # (the first round looks at every class)
    moved = np.empty(num_states, np.int64)  # states given a new class this round
    for _ in range(rounds):
        class_size[:num_classes + 1] = 0  # members of each class, in state order (a counting sort)
        for s in range(num_states):
            class_size[classes[s] + 1] += 1
        for c in range(num_classes):
            class_start[c + 1] = class_start[c] + class_size[c + 1]
        for c in range(num_classes):
            class_size[c] = class_start[c]
        for s in range(num_states):
            order[class_size[classes[s]]] = s
            class_size[classes[s]] += 1
        refined[:] = classes
        count, num_moved = num_classes, 0
        for c in range(num_classes):
            first, last = class_start[c], class_start[c + 1]
            if not candidate[c] or last - first < 2:  # (a class of one stays alone)
                continue
            stamp += 1  # a fresh table for this class's signatures (the successors' classes)
            for j in range(first, last):
                s = order[j]
                h = np.uint64(_FNV_OFFSET)
                for k in range(num_columns):
                    h = (h ^ np.uint64(classes[columns[s, k]])) * np.uint64(_FNV_PRIME)
                h ^= h >> np.uint64(29)
                i = np.int64(h & np.uint64(size - 1))
                while True:
                    if slot_stamp[i] != stamp:  # a new signature: the first keeps the class, others take new ones
                        slot_stamp[i], slot_state[i], slot_hash[i] = stamp, s, h
                        if j > first:
                            refined[s] = count
                            count += 1
                            moved[num_moved] = s
                            num_moved += 1
                        break
                    other = slot_state[i]
                    if slot_hash[i] == h:
                        same = True
                        for k in range(num_columns):
                            if classes[columns[other, k]] != classes[columns[s, k]]:
                                same = False
                                break
                        if same:
                            if refined[other] != c:
                                refined[s] = refined[other]
                                moved[num_moved] = s
                                num_moved += 1
                            break
                    i = (i + 1) & (size - 1)
        if count == num_classes:
            break  # stable: every further round is the same partition
        classes[:] = refined
        num_classes = count
        if num_classes * 10 > num_states * 9:  # nearly every state alone already: no class worth the next rounds
            return np.arange(num_states, dtype=np.int64)
        candidate[:num_classes] = False
        for m in range(num_moved):
            t = moved[m]
            for e in range(pred_ptr[t], pred_ptr[t + 1]):
                candidate[classes[preds[e]]] = True
    return classes


@warm_up
def _signatures() -> None:
    """A two-state rule table, in the types `index.state_classes.lookahead_classes` passes."""
    refine_classes.dispatcher(np.zeros((2, 256), np.int32), np.zeros(2, np.int64), 16)
