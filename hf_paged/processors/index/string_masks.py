"""String-body masks as slices of one per-vocabulary plan: a body state's first visit without vocabulary-sized work.

A state with a string body (`string_steps`) allows the body tokens of at most k characters (k = its steps, capped at
the longest body token) plus the few other tokens that stay alive (`TrieWalk._others_alive`). The body part
depends only on (vocabulary, body split, k), so it is laid out once per split of a vocabulary:

    ids     | body tokens by character count: 1 char | 2 chars | ... | max |
    counts             counts[k] = body tokens of at most k characters
    words   [max + 1, num_words]: words[k] = bitmask of ids[:counts[k]]

and a state's mask is `words[k]` plus the bits of its extra ids (its allowed ids `ids[:counts[k]] + extra`, its
count `counts[k] + len(extra)`): a 6 KB copy and a few bit sets where the direct computation scanned and sorted
the 50k-token vocabulary (~0.2 ms hot, 0.5-1 ms with cold caches).
A plan is memoised on its split (`BodyTokens.plan`), so every schema over the vocabulary shares it.

A state whose biggest byte group G leads into a body (a free-form key's first character) uses the plan of the
body's `skip_first` split (the tokens' bytes past the first) ANDed with the words of the tokens starting in G
(`group_words`, from the trie's per-first-byte words); its ids are then read back from the words (50 KB of
bools, not 400 KB of ids).
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np

from hf_paged.after_fork import renew_locks_after_fork
from hf_paged.processors.index.string_tokens import BodyTokens
from hf_paged.processors.index.token_trie import TokenTrie

__all__ = ["BodyPlan", "PlannedIds", "body_plan", "count_bits", "group_words", "set_bits"]

_MAX_GROUPS = 64  # first-byte groups memoised per plan (6 KB each with GPT-2)
_LOCK = threading.Lock()
renew_locks_after_fork(globals(), "_LOCK")  # a forked child gets a free lock (after_fork.py)


@dataclass(slots=True)
class BodyPlan:
    """The body tokens of one split by character count (immutable, shared)."""

    ids: np.ndarray  # int64: body token ids by character count
    counts: np.ndarray  # int64 [max_chars + 1]: counts[k] = body tokens of at most k characters
    words: np.ndarray  # int32 [max_chars + 1, num_words]: words[k] has the bits of ids[:counts[k]]
    groups: dict = field(default_factory=dict)  # first-byte group (ASCII bit set) -> its tokens' words (`group_words`)

    def row(self, steps: int) -> int:
        """The row of a body that takes `steps` characters for sure (longer budgets read as the longest)."""
        return min(steps, self.counts.shape[0] - 1)


@dataclass(slots=True)
class PlannedIds:
    """A body state's allowed regular tokens: the plan's body tokens of at most `row` characters, and `extra`."""

    plan: BodyPlan
    row: int
    extra: np.ndarray  # int64 ids allowed besides the plan's body tokens (disjoint from them, no repeats)
    # with a `skip_first` split: only the plan's tokens whose first byte is in this group count (bit set of ASCII
    # bytes, and the words of every token starting with one of them); None: all of them
    group: int | None = None
    group_words: np.ndarray | None = None

    def body_words(self) -> np.ndarray:
        """The bitmask words of the plan's tokens that are allowed (a fresh copy)."""
        words = self.plan.words[self.row].copy()
        if self.group_words is not None:
            words &= self.group_words
        return words

    def ids(self) -> np.ndarray:
        """Every allowed regular id (unordered)."""
        if self.group_words is None:
            return np.concatenate([self.plan.ids[: self.plan.counts[self.row]], self.extra])
        bits = np.unpackbits(self.body_words().view(np.uint8), bitorder="little")
        return np.concatenate([np.flatnonzero(bits), self.extra])


def count_bits(words: np.ndarray) -> int:
    """The number of set bits in the int32 bitmask `words`."""
    if hasattr(np, "bitwise_count"):  # numpy >= 2.0
        return int(np.bitwise_count(words.view(np.uint32)).sum())
    return int(np.unpackbits(words.view(np.uint8)).sum())


def set_bits(words: np.ndarray, ids: np.ndarray) -> None:
    """Set the bits of `ids` in the int32 bitmask `words`, in place (ids may share a word)."""
    if ids.shape[0] > 64:  # many: through a bool per token (`ufunc.at` costs ~20 ns an id: 0.3 ms for 15k)
        bits = np.zeros(words.shape[0] * 32, dtype=bool)
        bits[ids] = True
        words |= np.packbits(bits, bitorder="little").view(np.int32)
    elif ids.shape[0]:
        np.bitwise_or.at(words.view(np.uint32), ids >> 5, np.left_shift(1, ids & 31).astype(np.uint32))


def group_words(trie: TokenTrie, plan: BodyPlan, group: int) -> np.ndarray:
    """The words of every token whose first byte is in the ASCII set `group` (memoised on the plan: the states
    of one schema meet a handful of groups, e.g. the first character of a free-form key)."""
    words = plan.groups.get(group)
    if words is None:
        members = [byte for byte in range(128) if group >> byte & 1]
        words = np.bitwise_or.reduce(trie.first_words[members], axis=0)
        with _LOCK:  # (decoding threads share plans: evict and insert as one step)
            if len(plan.groups) >= _MAX_GROUPS:
                plan.groups.pop(next(iter(plan.groups)), None)
            plan.groups[group] = words
    return words


def body_plan(trie: TokenTrie, split: BodyTokens) -> BodyPlan:
    """The plan of `split`'s body tokens (~1 ms with GPT-2's vocabulary; memoised on the split)."""
    plan = split.plan
    if plan is not None:
        return plan
    vocab_size = len(trie.token_bytes)
    positions = np.flatnonzero(split.chars >= 0)
    chars = split.chars[positions]
    order = np.argsort(chars.astype(np.int16), kind="stable")  # a radix sort: 10x faster than on int64
    chars, ids = chars[order], trie.pos_ids[positions[order]]
    max_chars = int(chars[-1]) if chars.shape[0] else 0
    counts = np.searchsorted(chars, np.arange(max_chars + 1), side="right").astype(np.int64)
    # row k = bits of the tokens of exactly k characters, then a running OR down the rows (at most k)
    num_words = (vocab_size + 31) // 32
    words = np.zeros((max_chars + 1, num_words), dtype=np.uint32)
    np.bitwise_or.at(words, (chars, ids >> 5), np.left_shift(1, ids & 31).astype(np.uint32))
    np.bitwise_or.accumulate(words, axis=0, out=words)
    plan = BodyPlan(ids, counts, words.view(np.int32))
    split.plan = plan  # (two threads may both build it: the same plan, one kept)
    return plan
