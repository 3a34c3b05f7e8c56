"""The token-level view of a `ByteDFA`, computed lazily: a state's allowed tokens on its first visit, memoised.

outlines-core's `Index` scans the whole vocabulary from every state up front (~0.6-1 ms per state with GPT-2's
50k tokens). Here a state's mask is computed when a sequence first reaches it, by walking the vocabulary trie
(`token_trie.py`) from that state (`token_walk.py`), and kept (bounded by `max_cached_bytes`) as its bitmask
words alone (6 KB with GPT-2), which the processors copy into their bitmask and apply in one compiled loop
(`mask_kernel`).

A token is allowed when its whole byte string stays out of the dead state (outlines-core's rule for an index
compiled from an end-anchored pattern, see `index_cache`; the property tests compare with outlines-core's eager
`Index`). Sequences hold a plain int state and move with `get_next_state`, which walks the token's bytes.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hf_paged.processors.automaton.byte_dfa import ByteDFA
from hf_paged.processors.index.bitmask import num_bitmask_words
from hf_paged.processors.index.grammar_masks import GrammarMasks
from hf_paged.processors.index.sizes import held_bytes
from hf_paged.processors.index.string_masks import PlannedIds, count_bits, set_bits
from hf_paged.processors.index.token_trie import TokenTrie
from hf_paged.processors.index.token_walk import NARROW_BYTES, TrieWalk
from hf_paged.processors.index.vocabulary import TokenVocabulary

__all__ = ["StateMask", "TokenIndex"]

WIDE_UNITS = 5  # a wide state's first mask costs about five narrow ones (`warm` counts in narrow-state units)
MAX_CACHED_BYTES = 64 << 20  # memoised masks per index: 6 KB of words each with GPT-2 (~10k states)


@dataclass(slots=True)
class StateMask:
    """Everything the processors need about one automaton state, computed once."""

    words: np.ndarray  # int32 [num_words]: bit `t % 32` of word `t // 32` set iff token t is allowed (EOS too)
    num_allowed: int  # allowed ids, EOS ids included
    forced: int  # the only allowed token when exactly one is allowed and EOS is not, else -1

    @property
    def num_bytes(self) -> int:
        return self.words.nbytes


class TokenIndex:
    """The token index of one regex over one vocabulary; outlines-core's `Index` API, masks lazily.

    Args:
        dfa: the regex's byte automaton.
        vocab: the vocabulary (its EOS ids are allowed exactly in final states).
        trie: the vocabulary's trie (`token_trie(vocab)`).
        max_cached_bytes: memory for memoised masks; past it, new states' masks are recomputed on each visit.
        narrow_bytes: states with at most this many live bytes are narrow (`TrieWalk.narrow_marked`).
    """

    def __init__(
        self,
        dfa: ByteDFA,
        vocab: TokenVocabulary,
        trie: TokenTrie,
        max_cached_bytes: int = MAX_CACHED_BYTES,
        narrow_bytes: int = NARROW_BYTES,
    ):
        self.dfa = dfa
        self.trie = trie
        self.vocab_size = vocab.vocab_size
        self.eos_token_ids = vocab.eos_token_ids
        self.max_cached_bytes = max_cached_bytes
        self._cached_bytes = 0
        self._other_bytes = 0  # everything else it holds, as `measure` last found it
        self._measured_at: tuple | None = None  # (states named, masks memoised) at that walk
        # called with (self, bytes) after a mask is memoised (`IndexCache` counts its entries' growth with it)
        self.on_grow: Callable[[TokenIndex, int], None] | None = None
        self._eos = np.asarray(self.eos_token_ids, dtype=np.int64)
        # a grammar automaton names states (and their finality) as walks reach them: read its array live
        self._finals = dfa.finals if dfa.lazy else dfa.finals.tolist()
        self._walk = TrieWalk(dfa, trie, narrow_bytes)
        # a grammar: masks of wide states inside rules from walks shared per lookahead class (`grammar_masks`)
        self._grammar = GrammarMasks(dfa, trie, self._walk) if dfa.lazy else None
        self._masks: dict[int, StateMask] = {}
        self._lock = threading.Lock()  # guards `_masks` and `_cached_bytes`
        self._building = threading.RLock()  # held while a mask is built (a union of states builds its members')

    # -- outlines-core's Index API ---------------------------------------------------------------------
    def get_initial_state(self) -> int:
        return self.dfa.initial

    def is_final_state(self, state: int) -> bool:
        if self._grammar is not None:  # a grammar automaton decides a boundary state's finality with its row
            self.dfa.ensure_one(state)
        return bool(self._finals[state])

    def get_final_states(self) -> list[int]:
        return np.flatnonzero(self.dfa.finals).tolist()

    def get_next_state(self, state: int, token_id: int) -> int | None:
        """The state after `token_id`, or None when the token is not allowed (EOS and special tokens included)."""
        raw = self.trie.token_bytes[token_id] if 0 <= token_id < len(self.trie.token_bytes) else None
        if raw is None:
            return None
        return self._walk.next_state(state, raw)

    def get_allowed_tokens(self, state: int) -> list[int]:
        """Allowed ids, ascending (every EOS id when `state` is final)."""
        mask = self.state_mask(state)
        bits = np.unpackbits(mask.words.view(np.uint8), bitorder="little")[: self.vocab_size]
        return np.flatnonzero(bits).tolist()

    # -- masks -------------------------------------------------------------------------------------------
    def cached_mask(self, state: int) -> StateMask | None:
        """The memoised mask of `state`, or None when it was never computed (or did not fit the memo)."""
        return self._masks.get(state)

    def state_mask(self, state: int) -> StateMask:
        """The mask of `state`: memoised, computed on first visit."""
        mask = self._masks.get(state)
        if mask is None:
            with self._building:  # (one build at a time: `warm` may run in the background beside decoding)
                mask = self._masks.get(state) or self._build_mask(state)
            kept = False
            with self._lock:
                if self._cached_bytes + mask.num_bytes <= self.max_cached_bytes and state not in self._masks:
                    self._masks[state] = mask
                    self._cached_bytes += mask.num_bytes
                    kept = True
            hook = self.on_grow
            if kept and hook is not None:  # (outside the lock: the hook takes its owner's)
                hook(self, mask.num_bytes)
        return mask

    # -- memory ------------------------------------------------------------------------------------------
    @property
    def num_bytes(self) -> int:
        """Bytes this index holds: its memoised masks (counted as they come) plus the automaton, its per-state views
        and per-rule facts as `measure` last found them (they grow as decoding reaches new states). The vocabulary's
        trie is shared by every index of the vocabulary and not counted."""
        return self._cached_bytes + self._other_bytes

    def measure(self) -> int:
        """Measure what the index holds besides its masks now (`sizes.held_bytes`, a walk over its arrays: ~50 ms
        for a grammar index over a 20k-token vocabulary after 3,000 states); returns `num_bytes`. Walks again only
        when states were named or masks memoised since the last walk (what its views and facts grow with)."""
        rows = self.dfa.num_built + 1 if self.dfa.lazy else None  # (a grammar's arrays: the states named so far)
        signature = (rows, len(self._masks))
        if signature == self._measured_at:
            return self.num_bytes
        self._measured_at = signature
        for _ in range(3):  # (decoding or the warm-up may grow a set while it is read: read again)
            try:
                self._other_bytes = held_bytes(self, skip=(self.trie, self._masks, self._lock, self._building),
                                               mapped_rows=rows)
                break
            except RuntimeError:
                continue
        return self.num_bytes

    def warm(self, max_units: int) -> int:
        """Compute masks ahead of decoding, nearest the start first: narrow states (keys, punctuation, numbers: tens
        of microseconds each, one unit), then wide ones (string bodies: ~0.1 ms with the per-vocabulary plans,
        `WIDE_UNITS` each), until `max_units` are spent. A count, not a clock: the same states are warm on any
        machine. Returns how many masks were computed.

        Run in the background once the index is published (`IndexCache`), beside the prompt's prefill and the first
        steps: decoding computes on first visit any mask this has not reached yet, and masks are built one at a
        time per index (whichever thread builds one, it is the same). The automaton-wide facts of string bodies
        (`TrieWalk.prepare`, ~0.7 us a state) come first, outside the budget.
        """
        if max_units > 0 and self.dfa.lazy:
            self.dfa.build_root_rows()  # (a grammar: its root rule's rows in one gather)
        if max_units > 0 and not self.dfa.lazy:
            # string bodies: the automaton-wide facts first, outside the budget (~0.7 us a state, a few percent of
            # building the automaton; inside it, a 10k-state automaton would have no budget left for masks). A
            # grammar's per-rule facts are not on the compile's path: `prepare`
            self._walk.prepare()
        units, num_warmed = 0, 0
        if self.dfa.lazy:  # states are named as walks reach them, nearest the start first: warm in that order
            state = self.dfa.initial
            while state < self.dfa.num_built and units < max_units:
                if self.cached_mask(state) is None:
                    units += 1 if self._walk.is_narrow(state) else WIDE_UNITS
                    self.state_mask(state)
                    num_warmed += 1
                state += 1
            return num_warmed
        # state ids follow the construction order (breadth-first from the start, initial = 0)
        num_live = (self.dfa.transitions[:-1] != self.dfa.dead).sum(axis=1)
        narrow = np.flatnonzero(num_live <= self._walk.narrow_bytes).tolist()
        wide = np.flatnonzero(num_live > self._walk.narrow_bytes).tolist()
        for state in narrow + wide:
            cost = 1 if num_live[state] <= self._walk.narrow_bytes else WIDE_UNITS
            if units + cost > max_units:
                break
            if self.cached_mask(state) is None:
                units += cost
                self.state_mask(state)
                num_warmed += 1
        return num_warmed

    def prepare(self) -> None:
        """A grammar's per-rule facts, for every rule, ahead of decoding's first visits: string-body facts, lookahead
        classes, closed key states (tens of ms for a big schema: a quarter of its compile when they were part of
        it). `IndexCache` runs this in its background thread once the index is published, beside decoding, which
        computes on first need whatever is not there yet; each fact is memoised by value, so the masks are the same
        whichever thread computes it. Nothing to do for a regex's automaton (`warm` prepared it)."""
        if self._grammar is not None:
            self._walk.prepare()
            self._grammar.prepare()

    def forced_token(self, state: int) -> int | None:
        """The only allowed token in `state` when nothing else (EOS included) is, else None."""
        forced = self.state_mask(state).forced
        return None if forced < 0 else forced

    def _build_mask(self, state: int) -> StateMask:
        walk = self._walk
        if self._grammar is None:
            if walk.is_narrow(state):
                return self._narrow_mask(state)
            return self._mask_of(walk.decide(state), self._finals[state])
        self.dfa.ensure_one(state)  # (its finality)
        members = self.dfa.set_members(state)
        if members is not None:  # several call stacks at once: the union of their masks (memoised, often met)
            return self._union([self.state_mask(member) for member in members], bool(self._finals[state]))
        if walk.is_narrow(state):  # keys, punctuation, numbers: a walk of the few subtrees of their live bytes
            return self._narrow_mask(state)
        found = walk.body_planned(state) or walk.closed_planned(state)  # a string body or a key: a plan, cheapest
        if found is None:
            shared = self._grammar.mask(state, bool(self._finals[state]), self._mask_of, walk.first_byte_planned)
            if shared is not None:
                return shared
            found = walk.first_byte_planned(state) or walk.decide(state, planned=False)
        return self._mask_of(found, self._finals[state])

    def _narrow_mask(self, state: int) -> StateMask:
        """A narrow state's mask from one compiled walk that sets the bits as it finds the tokens (`narrow_marked`):
        the first visit of a key or a number costs a few microseconds, no Python step per token."""
        final = bool(self._finals[state])
        words = np.zeros(num_bitmask_words(self.vocab_size), dtype=np.uint32)
        ids = self._walk.narrow_marked(state, words)
        if ids is None:
            return self._mask_of(self._walk.decide(state, planned=False), final)
        num_allowed = ids.shape[0] + (len(self.eos_token_ids) if final else 0)
        forced = int(ids[0]) if ids.shape[0] == 1 and not final else -1
        if final:
            set_bits(words.view(np.int32), self._eos)
        return StateMask(words.view(np.int32), num_allowed, forced)

    def _mask_of(self, found: list[int] | np.ndarray | PlannedIds, final: bool) -> StateMask:
        """The mask of a state whose allowed regular ids are `found` (EOS added when `final`)."""
        if isinstance(found, PlannedIds):
            return self._planned_mask(found, final)
        num_words = num_bitmask_words(self.vocab_size)
        num_found = len(found)
        num_allowed = num_found + (len(self.eos_token_ids) if final else 0)
        forced = int(found[0]) if num_found == 1 and not final else -1
        if isinstance(found, list):  # few, found by the Python walk: no vocabulary-sized array at all
            bits: dict[int, int] = {}
            for token_id in found + list(self.eos_token_ids) if final else found:
                bits[token_id >> 5] = bits.get(token_id >> 5, 0) | (1 << (token_id & 31))
            words = np.zeros(num_words, dtype=np.uint32)
            words[list(bits)] = list(bits.values())
            return StateMask(words.view(np.int32), num_allowed, forced)
        words = np.zeros(num_words, dtype=np.int32)
        set_bits(words, found)
        if final:
            set_bits(words, self._eos)
        return StateMask(words, num_allowed, forced)

    def _union(self, masks: list[StateMask], final: bool) -> StateMask:
        """The mask allowing what any of `masks` allows (EOS ids exactly when `final`)."""
        words = masks[0].words.copy()
        for mask in masks[1:]:
            np.bitwise_or(words, mask.words, out=words)
        eos = self._eos
        np.bitwise_and.at(words.view(np.uint32), eos >> 5, ~np.left_shift(1, eos & 31).astype(np.uint32))
        if final:
            set_bits(words, eos)
        return self._from_bits(words)

    def _from_bits(self, words: np.ndarray) -> StateMask:
        """A mask from its words alone (EOS bits included): the count and the forced token read from them."""
        num_allowed = count_bits(words)
        forced = -1
        if num_allowed == 1:
            word = int(np.flatnonzero(words)[0])
            token = 32 * word + (int(words.view(np.uint32)[word]).bit_length() - 1)
            forced = -1 if token in self.eos_token_ids else token
        return StateMask(words, num_allowed, forced)

    def _planned_mask(self, found: PlannedIds, final: bool) -> StateMask:
        """A string body's mask from its plan row: a copy of the row's words plus the extra bits, counted from the
        plan (or, for a first-byte group, from the words)."""
        plan, extra = found.plan, found.extra
        words = found.body_words()
        set_bits(words, extra)
        if final:
            set_bits(words, self._eos)
        if found.group_words is not None:  # the words are the truth: count them
            return self._from_bits(words)
        count = int(plan.counts[found.row])
        num_found = count + extra.shape[0]
        num_allowed = num_found + (len(self.eos_token_ids) if final else 0)
        forced = -1
        if num_found == 1 and not final:
            forced = int(found.ids()[0])
        return StateMask(words, num_allowed, forced)
