"""A string body's mask straight from per-vocabulary token facts, without walking the trie.

In a state with a body (`string_steps`: ASCII bytes A, maybe every multi-byte character, each one step along a
chain that takes `steps` characters for sure), the regular tokens split in two:

    body tokens   every byte ASCII in A, or part of a well-formed multi-byte character (when the body takes
                  them): allowed iff their characters fit, `chars <= steps` (a cut-short last character counts);
                  a longer one reads its character number steps + 1 in the state q after the chain, and is
                  banned when q kills every body byte (checked; otherwise this path is not taken)
    other tokens  a quote, a backslash, a control byte, malformed UTF-8 ... : walked exactly, one by one in a
                  compiled loop (`TrieWalk._others_alive`; a JSON string body has ~300 of them in GPT-2's 50k)

The same split of the tokens' bytes past their first one (`skip_first`) serves states whose biggest byte group
leads into a body (`TrieWalk._first_byte_allowed`).

Which tokens are body tokens, and their character counts, depend only on the vocabulary and (A, multibyte):
memoised per trie (`TokenTrie.bodies`), so every string body of every schema shares one computation, and a
first visit costs a comparison over the vocabulary plus the walk of the others (~100 us instead of ~0.5-7 ms).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.processors.index.token_trie import TokenTrie
from hf_paged.processors.index.walk_kernel import pack_tokens

__all__ = ["JSON_KEY_ASCII", "JSON_STRING_ASCII", "MAX_OTHERS", "BodyTokens", "body_tokens"]

# the ASCII of a JSON string's body, `[^"\\\x00-\x1f]`: 0x20..0x7f but the quote and the backslash
JSON_STRING_ASCII = sum(1 << byte for byte in range(0x20, 0x80) if byte not in b'"\\')
# the ASCII of a free-form (undeclared) key's body, printable and escape-free (`schema.objects._KEY_CHARS`)
JSON_KEY_ASCII = sum(1 << byte for byte in range(0x20, 0x7F) if byte not in b'"\\')
MAX_OTHERS = 4096  # past this many other tokens (a narrow body such as `[a-z]*`) the trie walk is cheaper
_MAX_BODIES = 64  # memoised bodies per vocabulary
_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)


@dataclass(slots=True)
class BodyTokens:
    """The vocabulary split for one body (immutable, shared)."""

    chars: np.ndarray  # int64 [num_positions]: characters of the token at each position, -1 for other tokens
    other_positions: np.ndarray  # int64 [K]: positions of the other tokens
    # their bytes one token after the other (uint8), and where each starts (int64 [K + 1]): `walk_tokens`'s form
    other_flat: np.ndarray
    other_offsets: np.ndarray
    complete: bool = True  # False: more than MAX_OTHERS others, their bytes were not gathered (undecided)
    plan: Any = None  # its `string_masks.BodyPlan`, built on first use


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
        return _remember(trie, key, BodyTokens(empty, empty, np.zeros(0, dtype=np.uint8), np.zeros(1, np.int64), False))
    low_word, high_word = np.uint64(ascii_bits & 0xFFFFFFFFFFFFFFFF), np.uint64(ascii_bits >> 64)
    inside = ((ascii_sets[:, 0] & ~low_word) | (ascii_sets[:, 1] & ~high_word)) == 0
    inside &= ~high | (utf8 if multibyte else False)
    others = np.flatnonzero(~inside)
    if others.shape[0] > MAX_OTHERS:  # a narrow body (hex digits, `[a-z]`): remembered as undecided, no bytes
        no_bytes, no_offsets = np.zeros(0, dtype=np.uint8), np.zeros(1, dtype=np.int64)
        return _remember(trie, key, BodyTokens(np.where(inside, chars, -1), others, no_bytes, no_offsets, False))
    flat, offsets = pack_tokens([trie.pos_bytes[p] for p in others.tolist()])
    return _remember(trie, key, BodyTokens(np.where(inside, chars, -1), others, flat, offsets))


def _remember(trie: TokenTrie, key: tuple[int, bool, bool], split: BodyTokens) -> BodyTokens:
    with _LOCK:
        if len(trie.bodies) >= _MAX_BODIES:
            trie.bodies.pop(next(iter(trie.bodies)))
        trie.bodies[key] = split
    return split
