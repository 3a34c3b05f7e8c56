"""Well-formed UTF-8, as the byte automata of JSON string bodies see it (for `string_steps` and `string_tokens`).

A string body (`[^"\\\\\\x00-\\x1f]`) takes every multi-byte character, each through one or more intermediate
automaton states, so "this token is made of body characters" is a UTF-8 question:

    per token (once per vocabulary):   is it well-formed UTF-8 (its last character may be cut short)?
    per automaton state (all at once): which state do the well-formed multi-byte characters from s end in?

Well-formed follows Unicode's table 3-7 (no overlongs, no surrogates, nothing past U+10FFFF), like the automata
that regex-automata (inside outlines-core) builds for Unicode classes.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from hf_paged.processors.jit import kernel, warm_up

__all__ = ["multibyte_ends", "multibyte_ends_numpy", "valid_utf8_suffixes"]

# (lead bytes, second-byte range, continuation bytes after the second): the well-formed sequences of
# Unicode 15, table 3-7 (no overlongs, no surrogates, nothing past U+10FFFF)
_SEQUENCES = [
    (range(0xC2, 0xE0), (0x80, 0xBF), 0),
    (range(0xE0, 0xE1), (0xA0, 0xBF), 1),
    ([*range(0xE1, 0xED), 0xEE, 0xEF], (0x80, 0xBF), 1),
    (range(0xED, 0xEE), (0x80, 0x9F), 1),
    (range(0xF0, 0xF1), (0x90, 0xBF), 2),
    (range(0xF1, 0xF4), (0x80, 0xBF), 2),
    (range(0xF4, 0xF5), (0x80, 0x8F), 2),
]
_SECOND = {}  # lead byte -> (low, high) of its second byte, and how many bytes the character has
for _leads, (_low, _high), _more in _SEQUENCES:
    for _lead in _leads:
        _SECOND[_lead] = (_low, _high, _more + 2)


def multibyte_ends(
    transitions: np.ndarray, states: np.ndarray | None = None, ensure: Callable[[np.ndarray], None] | None = None
) -> np.ndarray:
    """See `multibyte_ends_numpy`; every state of a table at once runs as one compiled loop (`multibyte_ends_all`,
    a `jit.kernel` whose twin is the numpy version: about a hundred numpy calls whatever the size)."""
    if states is None and ensure is None:
        return multibyte_ends_all(np.ascontiguousarray(transitions, dtype=np.int32))
    return multibyte_ends_numpy(transitions, states, ensure)


def multibyte_ends_numpy(
    transitions: np.ndarray, states: np.ndarray | None = None, ensure: Callable[[np.ndarray], None] | None = None
) -> np.ndarray:
    """int64 `[S + 1]` (or one per entry of `states`): per state s, the one state that every well-formed multi-byte
    character read from s ends in, or -1 when they end in several (or, to keep this vectorised, when the state
    after a lead byte is not the same for every allowed byte of a range: a string body's always is). When it is a
    live state, every prefix of every character is alive too (the dead state is absorbing). All states: ~0.7 us a
    state; a few states of a big automaton: ~0.1-0.3 ms (only the rows they reach). `ensure` (a grammar
    automaton's) builds the rows of `states` and of the states they reach before they are read."""
    table = transitions
    if states is None:  # every state: each range's uniform target once per state, then gathers
        states = np.arange(table.shape[0])
        full: dict[tuple[int, int], np.ndarray] = {}

        def uniform(rows: np.ndarray, low: int, high: int) -> np.ndarray:
            if (low, high) not in full:
                block = table[:, low : high + 1]
                full[low, high] = np.where((block == block[:, :1]).all(axis=1), block[:, 0], -1)
            return full[low, high][rows]

    else:  # a few states: only the rows they reach (a body's lead bytes share a handful of next states)

        def uniform(rows: np.ndarray, low: int, high: int) -> np.ndarray:
            if ensure is not None:
                ensure(rows.reshape(-1))
            if rows.size * (high + 1 - low) <= 1 << 16:  # small: gather the blocks as they come
                block = table[rows, low : high + 1]
                return np.where((block == block[..., :1]).all(axis=-1), block[..., 0], -1)
            unique, inverse = np.unique(rows, return_inverse=True)
            block = table[unique, low : high + 1]
            return np.where((block == block[:, :1]).all(axis=1), block[:, 0], -1)[inverse.reshape(rows.shape)]

    if ensure is not None:
        ensure(states)
    ends = np.full(states.shape[0], -2, dtype=np.int64)  # -2: no group seen yet
    for leads, (low, high), more in _SEQUENCES:
        reached = uniform(table[states[:, None], list(leads)], low, high)  # [n, leads]: after the second byte
        for _ in range(more):
            reached = np.where(reached >= 0, uniform(np.maximum(reached, 0), 0x80, 0xBF), -1)
        same = (reached == reached[:, :1]).all(axis=1) & (reached[:, 0] >= 0)
        group = np.where(same, reached[:, 0], -1)
        ends = np.where(ends == -2, group, np.where(ends == group, ends, -1))
    return ends


# -- every state at once, compiled: per byte range R of a second or continuation byte (five in table 3-7),
# uniform_R[s] is the state every byte of R leads s to (or -1); then per state and group of lead bytes, as above.

def _layout():
    """The groups of `_SEQUENCES` as arrays: lead bytes (CSR by group), each group's second-byte range (an index
    into `_RANGES`) and its number of continuation bytes after the second."""
    ranges = sorted({second for _, second, _ in _SEQUENCES} | {(0x80, 0xBF)})
    leads = [lead for group, _, _ in _SEQUENCES for lead in group]
    ptr = np.cumsum([0] + [len(list(group)) for group, _, _ in _SEQUENCES])
    second = [ranges.index(s) for _, s, _ in _SEQUENCES]
    more = [m for _, _, m in _SEQUENCES]
    return (np.array(ranges, np.int64), np.array(leads, np.int64), ptr.astype(np.int64), np.array(second, np.int64),
            np.array(more, np.int64), ranges.index((0x80, 0xBF)))


_RANGES, _LEADS, _LEAD_PTR, _SECOND_RANGE, _MORE, _CONTINUATION = _layout()


def _all_states_numpy(table):
    return multibyte_ends_numpy(table)


@kernel(python=_all_states_numpy)
def multibyte_ends_all(table):  # pragma: no cover (compiled; `multibyte_ends_numpy` is the reference)
    num_states = table.shape[0]
    uniform = np.empty((_RANGES.shape[0], num_states), np.int64)
    for k in range(_RANGES.shape[0]):
        low, high = _RANGES[k, 0], _RANGES[k, 1]
        for s in range(num_states):
            value = table[s, low]
            for b in range(low + 1, high + 1):
                if table[s, b] != value:
                    value = -1
                    break
            uniform[k, s] = value
    ends = np.empty(num_states, np.int64)
    for s in range(num_states):
        end = -2  # no group seen yet
        for g in range(_LEAD_PTR.shape[0] - 1):
            first = np.int64(-1)
            agree = True
            for i in range(_LEAD_PTR[g], _LEAD_PTR[g + 1]):
                reached = uniform[_SECOND_RANGE[g], table[s, _LEADS[i]]]
                for _ in range(_MORE[g]):
                    if reached >= 0:
                        reached = uniform[_CONTINUATION, reached]
                if i == _LEAD_PTR[g]:
                    first = reached
                elif reached != first:
                    agree = False
            group = first if agree and first >= 0 else -1
            end = group if end == -2 else (end if end == group else -1)
        ends[s] = end
    return ends


@warm_up
def _signatures() -> None:
    """A one-state table, as `string_steps` passes it."""
    multibyte_ends_all.dispatcher(np.zeros((1, 256), np.int32))


def valid_utf8_suffixes(raw: bytes) -> list[bool]:
    """`ok[i]` for i in 0..len(raw): `raw[i:]` is well-formed UTF-8 starting at a character boundary, its last
    character possibly cut short (`ok[len(raw)]` is True: the empty suffix)."""
    n = len(raw)
    ok = [False] * (n + 1)
    ok[n] = True
    for i in range(n - 1, -1, -1):
        byte = raw[i]
        if byte < 0x80:
            ok[i] = ok[i + 1]
            continue
        shape = _SECOND.get(byte)
        if shape is None:  # a continuation byte, C0/C1 or F5..FF: never starts a character
            continue
        low, high, length = shape
        end = min(i + length, n)  # a character cut by the end of the token is fine
        good = end == i + 1 or low <= raw[i + 1] <= high
        good = good and all(0x80 <= raw[j] <= 0xBF for j in range(i + 2, end))
        ok[i] = good and ok[end]
    return ok
