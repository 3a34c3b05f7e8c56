"""Per-vocabulary plans of string bodies (`string_masks`): rows by character count, first-byte groups, and the
masks built from them, against brute force over a small vocabulary (the eager-`Index` comparisons of
`test_string_tokens` and `test_token_index` go through the same path)."""

from __future__ import annotations

import gc

import numpy as np

from hf_paged.processors.automaton import anchored
from hf_paged.processors.automaton.byte_dfa import build_byte_dfa
from hf_paged.processors.index import string_masks
from hf_paged.processors.index.string_masks import PlannedIds, body_plan, count_bits, group_words, set_bits
from hf_paged.processors.index.string_tokens import JSON_KEY_ASCII, JSON_STRING_ASCII, body_tokens
from hf_paged.processors.index.token_index import TokenIndex
from hf_paged.processors.index.token_trie import build_token_trie
from hf_paged.processors.index.token_walk import TrieWalk
from tests.processors.test_string_tokens import UTF8_TOKENS, UTF8_VOCAB

TRIE = build_token_trie(UTF8_VOCAB.tokens, UTF8_VOCAB.vocab_size)
ID_BYTES = {i: raw for i, raw in enumerate(UTF8_TOKENS, start=1)}  # `make_vocab`: id = position + 1


def _bits(words: np.ndarray) -> set[int]:
    return set(np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little")).tolist())


def test_plan_rows_hold_the_body_tokens_of_at_most_k_characters():
    split = body_tokens(TRIE, JSON_STRING_ASCII, True)
    plan = body_plan(TRIE, split)
    assert body_plan(TRIE, split) is plan  # memoised on the split
    assert len(set(plan.ids.tolist())) == plan.ids.shape[0] == plan.counts[-1]  # each body token once
    chars_of = {int(TRIE.pos_ids[p]): int(c) for p, c in enumerate(split.chars) if c >= 0}
    assert chars_of[next(i for i, raw in ID_BYTES.items() if raw == b"abcdefgh")] == 8
    for k in range(plan.counts.shape[0]):
        expected = {i for i, c in chars_of.items() if c <= k}
        assert set(plan.ids[: plan.counts[k]].tolist()) == expected, k
        assert _bits(plan.words[k]) == expected, k
    assert plan.counts[-1] == len(chars_of)  # the last row: every body token
    assert plan.row(1 << 30) == plan.counts.shape[0] - 1 and plan.row(2) == 2


def test_group_words_and_planned_ids_of_a_first_byte_group():
    split = body_tokens(TRIE, JSON_KEY_ASCII, False, skip_first=True)
    plan = body_plan(TRIE, split)
    group = sum(1 << b for b in b"abz")
    words = group_words(TRIE, plan, group)
    assert group_words(TRIE, plan, group) is words  # memoised on the plan
    starts = {i for i, raw in ID_BYTES.items() if raw[:1] in (b"a", b"b", b"z")}
    assert _bits(words) == starts
    extra = np.array([ord("{") + 1], dtype=np.int64)  # "{": outside the group, allowed by some other walk
    planned = PlannedIds(plan, 1, extra, group, words)
    rest_ok = {int(TRIE.pos_ids[p]) for p, c in enumerate(split.chars) if 0 <= c <= 1}
    assert sorted(planned.ids().tolist()) == sorted((rest_ok & starts) | {ord("{") + 1})
    assert _bits(planned.body_words()) == rest_ok & starts


def test_count_and_set_bits(monkeypatch):
    words = np.zeros(4, dtype=np.int32)
    set_bits(words, np.array([0, 31, 31, 32, 127], dtype=np.int64))  # a repeated id and a shared word
    assert _bits(words) == {0, 31, 32, 127} and count_bits(words) == 4
    monkeypatch.delattr(np, "bitwise_count", raising=False)  # numpy < 2.0
    assert string_masks.count_bits(words) == 4


def test_trie_first_byte_facts():
    for byte in (ord("a"), ord('"'), 0xC3, 0xE2):
        assert _bits(TRIE.first_words[byte]) == {i for i, raw in ID_BYTES.items() if raw[0] == byte}


def test_planned_masks_name_the_same_tokens_as_the_trie_walk():
    # a JSON string (own body: plain and counted) and a free-form key's first character (a first-byte group)
    for regex in ('"[^"\\\\\\x00-\\x1f]{0,3}"', '\\{"(?:[ !#-\\[\\]-~][ !#-\\[\\]-~]*|b)":1\\}'):
        dfa = build_byte_dfa(anchored(regex))
        walk = TrieWalk(dfa, TRIE, narrow_bytes=0)
        reference = TrieWalk(dfa, TRIE, narrow_bytes=0)
        reference.use_bodies = False
        index = TokenIndex(dfa, UTF8_VOCAB, TRIE, narrow_bytes=0)
        planned = 0
        for state in range(dfa.num_states):
            found = walk.decide(state)
            expected = sorted(np.asarray(reference.allowed(state)).tolist())
            if isinstance(found, PlannedIds):
                planned += 1
                assert sorted(found.ids().tolist()) == expected, (regex, state)
                mask = index.state_mask(state)
                final = bool(dfa.finals[state])
                assert _bits(mask.words) == set(expected) | ({0} if final else set())
                assert mask.num_allowed == len(expected) + final
        assert planned >= 2, regex


def test_per_state_views_hold_no_objects_for_the_garbage_collector():
    """Lists of ints here made young collections visit 256 scattered ints per state: ms pauses on first visits.
    The rows are arrays (tracked, but holding no objects), the live bytes `bytes` (untracked)."""
    dfa = build_byte_dfa(anchored('"[^"]*"'))
    walk = TrieWalk(dfa, TRIE)
    assert walk.next_state(0, b'"ab') is not None
    walk.allowed(0)
    assert not any(isinstance(o, int) for o in gc.get_referents(walk._rows[0])) and not gc.is_tracked(walk._live[0])


def test_per_byte_token_counts_and_the_early_undecided_split(monkeypatch):
    assert TRIE.byte_tokens[ord("a")] == sum(b"a" in raw for raw in UTF8_TOKENS)
    assert TRIE.byte_tokens_1[ord("a")] == sum(b"a" in raw[1:] for raw in UTF8_TOKENS)
    import hf_paged.processors.index.string_tokens as module

    monkeypatch.setattr(module, "MAX_OTHERS", 8)
    digits = sum(1 << b for b in b"0123456789")
    split = body_tokens(TRIE, digits, False)  # a lone "a" (and far more) refused: more than 8 others for sure
    assert not split.complete and split.chars.shape == (0,)
    monkeypatch.setattr(module, "MAX_OTHERS", 1000)  # the quote, the backslash, controls: each in few tokens
    wide = body_tokens(TRIE, JSON_STRING_ASCII & ~(1 << ord("x")), True)
    assert wide.complete and wide.chars.shape[0] == TRIE.num_tokens
