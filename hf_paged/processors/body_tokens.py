"""A string body's mask straight from per-vocabulary token facts, without walking the trie.

In a state with a body (`body_steps`: ASCII bytes A, maybe every multi-byte character, each one step along a
chain that takes `steps` characters for sure), the regular tokens split in two:

    body tokens   every byte ASCII in A, or part of a well-formed multi-byte character (when the body takes
                  them): allowed iff their characters fit, `chars <= steps` (a cut-short last character counts);
                  a longer one reads its character number steps + 1 in the state q after the chain, and is
                  banned when q kills every body byte (checked; otherwise this path is not taken)
    other tokens  a quote, a backslash, a control byte, malformed UTF-8 ... : walked exactly, byte column by
                  byte column over all of them at once (a JSON string body has ~300 of them in GPT-2's 50k)

The same split of the tokens' bytes past their first one (`skip_first`) serves states whose biggest byte group
leads into a body (`TrieWalk._first_byte_allowed`).

Which tokens are body tokens, and their character counts, depend only on the vocabulary and (A, multibyte):
memoised per trie (`TokenTrie.bodies`), so every string body of every schema shares one computation, and a
first visit costs a comparison over the vocabulary plus the walk of the others (~100 us instead of ~0.5-7 ms).
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from hf_paged.processors.token_trie import TokenTrie

__all__ = ["JSON_KEY_ASCII", "JSON_STRING_ASCII", "MAX_OTHERS", "BodyTokens", "body_tokens", "walk_others"]

# the ASCII of a JSON string's body, `[^"\\\x00-\x1f]`: 0x20..0x7f but the quote and the backslash
JSON_STRING_ASCII = sum(1 << byte for byte in range(0x20, 0x80) if byte not in b'"\\')
# the ASCII of a free-form (undeclared) key's body, printable and escape-free (`schema_objects._KEY_CHARS`)
JSON_KEY_ASCII = sum(1 << byte for byte in range(0x20, 0x7F) if byte not in b'"\\')
MAX_OTHERS = 4096  # past this many other tokens (a narrow body such as `[a-z]*`) the trie walk is cheaper
_MAX_BODIES = 64  # memoised bodies per vocabulary
_LOCK = threading.Lock()


@dataclass(slots=True)
class BodyTokens:
    """The vocabulary split for one body (immutable, shared)."""

    chars: np.ndarray  # int64 [num_positions]: characters of the token at each position, -1 for other tokens
    other_positions: np.ndarray  # int64 [K]: positions of the other tokens, longest first
    other_bytes: np.ndarray  # uint8 [K, width]: their bytes, zero-padded
    other_lengths: np.ndarray  # int64 [K]: their lengths (descending)
    complete: bool = True  # False: more than MAX_OTHERS others, their bytes were not gathered (undecided)
    plan: Any = None  # its `body_masks.BodyPlan`, built on first use
    # the same bytes one token after the other (uint8), and where each starts (int64 [K + 1]): `walk_tokens`'s form
    other_flat: np.ndarray | None = None
    other_offsets: np.ndarray | None = None


def body_tokens(trie: TokenTrie, ascii_bits: int, multibyte: bool, skip_first: bool = False) -> BodyTokens:
    """The split of `trie`'s tokens for the body of ASCII set `ascii_bits` (bit b = byte b < 128) and `multibyte`
    (the body takes every well-formed multi-byte character); with `skip_first`, of the tokens' bytes past their
    first one (a one-byte token is then a body token of 0 characters). Memoised per trie."""
    key = (ascii_bits, multibyte, skip_first)
    hit = trie.bodies.get(key)
    if hit is not None:
        return hit
    if skip_first:
        ascii_sets, high, chars, utf8 = trie.pos_ascii_1, trie.pos_high_1, trie.pos_chars_1, trie.pos_utf8_1
    else:
        ascii_sets, high, chars, utf8 = trie.pos_ascii, trie.pos_high, trie.pos_chars, trie.pos_utf8
    # tokens holding a byte the body refuses are others: when one such byte alone is in too many, the split is
    # undecided (a narrow body: digits, letters), known without the ~0.3 ms scan of the vocabulary below
    refused = [b for b in range(128) if not ascii_bits >> b & 1] + ([] if multibyte else list(range(128, 256)))
    if refused and int((trie.byte_tokens_1 if skip_first else trie.byte_tokens)[refused].max()) > MAX_OTHERS:
        empty = np.zeros(0, dtype=np.int64)
        return _remember(trie, key, BodyTokens(empty, empty, np.zeros((0, 0), dtype=np.uint8), empty, False))
    low_word, high_word = np.uint64(ascii_bits & 0xFFFFFFFFFFFFFFFF), np.uint64(ascii_bits >> 64)
    inside = ((ascii_sets[:, 0] & ~low_word) | (ascii_sets[:, 1] & ~high_word)) == 0
    inside &= ~high | (utf8 if multibyte else False)
    others = np.flatnonzero(~inside)
    if others.shape[0] > MAX_OTHERS:  # a narrow body (hex digits, `[a-z]`): remembered as undecided, no matrix
        no_bytes, no_lengths = np.zeros((0, 0), dtype=np.uint8), np.zeros(0, dtype=np.int64)
        return _remember(trie, key, BodyTokens(np.where(inside, chars, -1), others, no_bytes, no_lengths, False))
    raws = [trie.pos_bytes[p] for p in others.tolist()]
    lengths = np.fromiter(map(len, raws), dtype=np.int64, count=len(raws))
    order = np.argsort(-lengths, kind="stable")
    others, lengths = others[order], lengths[order]
    width = int(lengths[0]) if lengths.shape[0] else 0
    # all their bytes in one buffer, scattered into the zero-padded rows (no Python step per token)
    flat = np.frombuffer(b"".join([raws[i] for i in order.tolist()]), dtype=np.uint8)
    rows = np.repeat(np.arange(others.shape[0]), lengths)
    columns = np.arange(flat.shape[0]) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    matrix = np.zeros((others.shape[0], width), dtype=np.uint8)
    matrix[rows, columns] = flat
    offsets = np.zeros(others.shape[0] + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    split = BodyTokens(np.where(inside, chars, -1), others, matrix, lengths, other_flat=flat.copy(), other_offsets=offsets)
    return _remember(trie, key, split)


def _remember(trie: TokenTrie, key: tuple[int, bool, bool], split: BodyTokens) -> BodyTokens:
    with _LOCK:
        if len(trie.bodies) >= _MAX_BODIES:
            trie.bodies.pop(next(iter(trie.bodies)))
        trie.bodies[key] = split
    return split


def walk_others(
    split: BodyTokens,
    transitions: np.ndarray,
    state: int,
    dead: int,
    keep: np.ndarray | None = None,
    ensure: Callable[[np.ndarray], None] | None = None,
) -> np.ndarray:
    """Positions of the other tokens (those where `keep`, if given) whose bytes keep `state` alive: one gather per
    byte column over the tokens still long enough (longest first, so a prefix), stopping once all are dead."""
    positions, matrix, lengths = split.other_positions, split.other_bytes, split.other_lengths
    if keep is not None:
        positions, matrix, lengths = positions[keep], matrix[keep], lengths[keep]
    states = np.full(positions.shape[0], state, dtype=np.int64)
    width = int(lengths[0]) if lengths.shape[0] else 0
    # how many have more than c bytes, for each column c (lengths descend: -lengths ascend)
    counts = np.searchsorted(-lengths, -np.arange(width), side="left").tolist()
    for column, count in enumerate(counts):
        if ensure is not None:  # a grammar automaton: build the rows about to be read
            ensure(states[:count])
        states[:count] = transitions[states[:count], matrix[:count, column]]
        if column % 4 == 3 and count and not (states[:count] != dead).any():
            break  # every token longer than this is dead already (the shorter ones are finished)
    return positions[states != dead]
