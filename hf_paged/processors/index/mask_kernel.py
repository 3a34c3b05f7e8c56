"""One logits row masked from its bitmask words (numpy, CPU): every column whose bit is clear, and every column
past the words (padded embedding rows), set to -inf in place.

`mask_row` is one compiled loop (a `jit.kernel`) over the words: an all-ones word is skipped, an all-zeros one
filled, a mixed one rewritten column by column with a select (a branch per bit cost ~90 us on a mixed mask,
mispredicted half the time). 1-14 us on a 50k row whatever the mask (a random half-allowed row is the worst
case), so a state's mask needs nothing but its 6 KB of words: no id list saved beside them (up to 200 KB a state,
whose first touch cost ~100 us of page faults on a first visit). Until the compiled loop is loaded, and for
float16 rows (which numba does not take), its numpy twin runs: a few gathers when few columns are allowed or few
banned, else one unpack of the words and a select over the row (~110 us on a mixed mask).
"""

from __future__ import annotations

import numpy as np

from hf_paged.processors.jit import kernel, warm_up

__all__ = ["mask_row", "mask_row_numpy"]

# JSON masks are nearly always sparse (a key, punctuation, digits: a few dozen tokens) or nearly full (inside a
# string: everything but quotes/backslashes/controls): the twin then touches only the words holding exceptions
_SPARSE_WORDS = 64
_BIT_OFFSETS = np.arange(32, dtype=np.int64)


def _set_bit_columns(word_ids: np.ndarray, words: np.ndarray) -> np.ndarray:
    """Columns of the set bits of `words[word_ids]`, ascending."""
    bits = np.unpackbits(words[word_ids].view(np.uint8), bitorder="little").view(bool)
    return (word_ids[:, None] * 32 + _BIT_OFFSETS).ravel()[bits]


def mask_row_numpy(values: np.ndarray, words: np.ndarray) -> None:
    """`mask_row` in numpy calls (any float dtype)."""
    width = values.shape[0]
    covered = min(width, words.shape[0] * 32)
    if np.count_nonzero(words) <= _SPARSE_WORDS:  # few allowed: save them, blank the row, put them back
        cols = _set_bit_columns(np.flatnonzero(words), words)
        cols = cols[cols < covered]
        saved = values[cols]
        values.fill(-np.inf)
        values[cols] = saved
        return
    inverted = np.invert(words)
    if np.count_nonzero(inverted) <= _SPARSE_WORDS:  # few banned: write just those
        cols = _set_bit_columns(np.flatnonzero(inverted), inverted)
        values[cols[cols < covered]] = -np.inf
    else:
        allowed = np.unpackbits(words.view(np.uint8), count=covered, bitorder="little").view(bool)
        values[:covered] = np.where(allowed, values[:covered], values.dtype.type(-np.inf))
    if covered < width:  # padded embedding rows past the vocabulary
        values[covered:] = -np.inf


@kernel(python=mask_row_numpy)
def mask_row(values, words):  # pragma: no cover (compiled; the tests compare it with the twin)
    """Set `values[c]` (a float32/float64 row) to -inf for every column c whose bit in the int32 `words` is
    clear, and for every column past `32 * len(words)`."""
    width = values.shape[0]
    covered = min(width, words.shape[0] * 32)
    whole = covered >> 5
    blocked = values.dtype.type(-np.inf)
    for w in range(whole):
        word = words[w]
        if word == -1:  # all 32 allowed (runs of them: well-predicted branches)
            continue
        base = w << 5
        if word == 0:  # none allowed
            for j in range(32):
                values[base + j] = blocked
            continue
        for j in range(32):  # a select, not a branch per bit: a mixed mask's bits are unpredictable
            value = values[base + j]
            values[base + j] = value if (word >> j) & 1 else blocked
    for column in range(whole << 5, covered):
        if (words[column >> 5] >> (column & 31)) & 1 == 0:
            values[column] = blocked
    for column in range(covered, width):
        values[column] = blocked


@warm_up
def _signatures() -> None:
    """The rows the processors mask: float32 (and float64) logits, int32 words."""
    words = np.zeros(1, np.int32)
    mask_row.dispatcher(np.zeros(40, np.float32), words)
    mask_row.dispatcher(np.zeros(40, np.float64), words)
