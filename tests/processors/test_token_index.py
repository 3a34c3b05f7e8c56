"""The lazy token index agrees with outlines-core's eager `Index` on every reachable state: masks, moves, finals."""

from __future__ import annotations

import re
from collections import deque

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from outlines_core import Index, Vocabulary

from hf_paged.processors.automaton import anchored
from hf_paged.processors.automaton.byte_dfa import build_byte_dfa
from hf_paged.processors.index.shared_trie import token_trie
from hf_paged.processors.index.token_index import TokenIndex
from hf_paged.processors.index.token_trie import build_token_trie
from hf_paged.processors.index.vocabulary import TokenVocabulary, build_vocabulary
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import byte_level_tokenizer

EOS = 0


def make_vocab(token_list: list[bytes]) -> TokenVocabulary:
    """A vocabulary of the given byte strings (id = position + 1; id 0 is EOS; a duplicate gets a second id)."""
    grouped: dict[bytes, list[int]] = {}
    for token_id, raw in enumerate(token_list, start=1):
        grouped.setdefault(raw, []).append(token_id)
    return TokenVocabulary(
        vocabulary=Vocabulary(EOS, grouped),
        fingerprint="test-" + repr(token_list),
        vocab_size=len(token_list) + 3,  # two ids past the tokens: never allowed (like padded rows)
        eos_token_ids=(EOS,),
        num_tokens=len(token_list),
        kind="test",
        tokens={raw: tuple(ids) for raw, ids in grouped.items()},
    )


# GPT-2-like: every single byte, multi-byte words, JSON punctuation, complete and partial UTF-8 sequences
SINGLE = [bytes([b]) for b in range(256)]
# fmt: off
MULTI = [
    b'{"', b'":', b'",', b'"}', b' "', b"na", b"name", b"me", b"12", b"123", b"true", b"fal", b"se", b"\\n", b'\\"',
    b"\xc3\xa9", b"\xc3", b"\xa9", b"a\xc3", b'\xa9"', b"\xe2\x80", b"\xe2\x80\x99", b"\x99s", b" \xe2\x80\x99",
    b"\xf0\x9f\x98", b"\x80\x80", b"  ", b"\n", b"0.", b".5", b"e+", b"null", b"name",  # "name" twice: two ids
]
# fmt: on
TOY = make_vocab(SINGLE + MULTI)


def check_against_eager(regex: str, vocab: TokenVocabulary, narrow_bytes: int) -> int:
    """Walk every state reachable in both indexes in lockstep; returns the number of states compared."""
    try:
        eager = Index(anchored(regex), vocab.vocabulary)
    except ValueError:
        # outlines-core refuses a pattern whose anchored start state is not universal, e.g. one matching the empty
        # string; ours, built behind a sentinel byte (`byte_dfa`), accepts it: its start state is final
        # exactly when the pattern matches the empty string, and a first byte it refuses starts no match of `re`
        try:
            dfa = build_byte_dfa(anchored(regex))
        except ValueError:
            return 0
        try:
            pattern = re.compile(regex)
        except re.error:  # Rust syntax Python does not read: nothing to compare with
            return 0
        assert bool(dfa.finals[dfa.initial]) == (pattern.fullmatch("") is not None), regex
        for b in range(32, 127):  # a first byte we refuse starts no match `re` finds either
            if dfa.transitions[dfa.initial, b] == dfa.dead:
                assert not any(pattern.fullmatch(chr(b) + tail) for tail in ("", "a", "0", "00", " ")), (regex, b)
        return 0
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    lazy = TokenIndex(build_byte_dfa(anchored(regex)), vocab, trie, narrow_bytes=narrow_bytes)
    lazy._walk.compiled_narrow = narrow_bytes < 256  # (256: every state node by node in Python)
    start = (eager.get_initial_state(), lazy.get_initial_state())
    seen, queue = {start}, deque([start])
    while queue:
        e_state, l_state = queue.popleft()
        expected = set(eager.get_allowed_tokens(e_state) or []) - {EOS}
        got = lazy.get_allowed_tokens(l_state)
        final = lazy.is_final_state(l_state)
        assert final == eager.is_final_state(e_state), (regex, e_state)
        assert set(got) - {EOS} == expected, (regex, sorted(expected ^ set(got)))
        assert (EOS in got) == final
        mask = lazy.state_mask(l_state)
        bits = np.unpackbits(mask.words.view(np.uint8), bitorder="little")
        assert np.flatnonzero(bits).tolist() == sorted(got)  # the words say the same as the ids
        assert mask.num_allowed == len(got)  # no token counted twice (the walk's parts are disjoint)
        assert mask.forced == (next(iter(expected)) if len(expected) == 1 and not final else -1)
        for token_id in expected:
            pair = (eager.get_next_state(e_state, token_id), lazy.get_next_state(l_state, token_id))
            assert pair[1] is not None
            if pair not in seen:
                seen.add(pair)
                queue.append(pair)
        for refused in {1, 2, 3, 34, 300, vocab.vocab_size - 1} - expected:
            assert lazy.get_next_state(l_state, refused) is None
    return len(seen)


ATOMS = st.sampled_from(["a", "b", "1", "0", "[0-9]", "[a-c]", '[^"]', "\\.", '"', "é", "’", " ", "name", "."])


def _regexes() -> st.SearchStrategy[str]:
    def extend(inner: st.SearchStrategy[str]) -> st.SearchStrategy[str]:
        return st.one_of(
            st.tuples(inner, inner).map("".join),
            st.tuples(inner, inner).map(lambda p: f"({p[0]}|{p[1]})"),
            st.tuples(inner, st.sampled_from(["?", "*", "+", "{2}", "{0,3}", "{1,2}"])).map(
                lambda p: f"(?:{p[0]}){p[1]}"
            ),
        )

    return st.recursive(ATOMS, extend, max_leaves=6)


@settings(max_examples=60, deadline=None)
@given(_regexes())
def test_random_regexes_match_the_eager_index(regex):
    check_against_eager(regex, TOY, narrow_bytes=0)  # the compiled walk all the way down
    check_against_eager(regex, TOY, narrow_bytes=4)  # mixed: narrow states and wide ones below them
    check_against_eager(regex, TOY, narrow_bytes=16)  # the default
    check_against_eager(regex, TOY, narrow_bytes=256)  # node by node in Python


def test_json_schema_regex_with_multibyte_and_partial_utf8_tokens():
    schema = {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 3}, "n": {"type": "integer"}, "ok": {"type": "boolean"}},
        "required": ["name", "n"],
    }
    regex = schema_to_regex(schema)
    assert check_against_eager(regex, TOY, narrow_bytes=0) > 20
    assert check_against_eager(regex, TOY, narrow_bytes=16) > 20


def test_string_shortcut_and_partial_utf8():
    index = TokenIndex(build_byte_dfa(anchored('"[^"]*"')), TOY, build_token_trie(TOY.tokens, TOY.vocab_size))
    inside = index.get_next_state(index.get_initial_state(), 1 + ord('"'))
    ids = {raw: i for i, raw in enumerate(SINGLE + MULTI, start=1)}
    # a lone UTF-8 lead byte is allowed (the next token completes it); a lone continuation byte is not
    assert index.get_next_state(inside, ids[b"\xc3"]) is not None
    assert index.get_next_state(inside, ids[b"\x80\x80"]) is None
    assert index.get_next_state(index.get_next_state(inside, ids[b"\xc3"]), ids[b'\xa9"']) is not None
    assert index.get_next_state(inside, EOS) is None and index.get_next_state(inside, TOY.vocab_size - 1) is None


def test_trie_of_a_real_tokenizer_lays_subtrees_out_contiguously():
    vocab = build_vocabulary(byte_level_tokenizer())
    trie = token_trie(vocab)
    assert token_trie(vocab) is trie  # memoised per vocabulary
    assert trie.num_tokens == vocab.num_tokens
    spelled = {}
    stack = [(0, b"")]
    while stack:
        node, prefix = stack.pop()
        below = {int(i) for i in trie.pos_ids[trie.pos_ptr[node] : trie.sub_end[node]]}
        assert below == {i for raw, ids in vocab.tokens.items() if raw.startswith(prefix) for i in ids}
        for token_id in trie.pos_ids[trie.pos_ptr[node] : trie.pos_ptr[node + 1]]:
            spelled[int(token_id)] = prefix
        for child in trie.child_ids[trie.child_ptr[node] : trie.child_ptr[node + 1]]:
            stack.append((int(child), prefix + bytes([trie.node_byte[child]])))
    assert spelled == {i: raw for raw, ids in vocab.tokens.items() for i in ids}


def test_masks_are_memoised_within_the_byte_budget():
    trie = build_token_trie(TOY.tokens, TOY.vocab_size)
    dfa = build_byte_dfa(anchored("[0-9]{3}"))
    index = TokenIndex(dfa, TOY, trie)
    first = index.state_mask(0)
    assert index.cached_mask(0) is first and index.state_mask(0) is first
    multi = [len(SINGLE) + 1 + MULTI.index(raw) for raw in (b"12", b"123")]  # "0." and ".5" are not digits
    assert index.get_allowed_tokens(0) == sorted([1 + b for b in b"0123456789"] + multi)
    assert first.num_allowed == 12 and first.num_bytes == first.words.nbytes
    tight = TokenIndex(dfa, TOY, trie, max_cached_bytes=first.num_bytes)
    tight.state_mask(0)
    after_one = tight.get_next_state(0, 1 + ord("1"))
    tight.state_mask(after_one)  # over budget: computed, not kept
    assert tight.cached_mask(0) is not None and tight.cached_mask(after_one) is None


def test_a_vocabulary_that_cannot_spell_the_pattern_is_unsatisfiable():
    from hf_paged.errors import UnsatisfiableSchemaError
    from hf_paged.processors.index.index_cache import IndexCache

    letters = make_vocab([b"a", b"b", b"ab"])
    with pytest.raises(UnsatisfiableSchemaError, match="no token of this vocabulary"):
        IndexCache().get_or_compile("digits", "[0-9]+", letters)


def test_warm_computes_masks_ahead_within_its_budget():
    from hf_paged.processors.index.index_cache import IndexCache

    compiled = IndexCache().get_or_compile("s", '"[^"]*",?', TOY).index
    assert compiled.cached_mask(compiled.get_initial_state()) is not None  # compile warms (its budget suffices)
    trie = build_token_trie(TOY.tokens, TOY.vocab_size)
    index = TokenIndex(compiled.dfa, TOY, trie)
    assert index.warm(0) == 0 and index.cached_mask(0) is None
    assert index.warm(3) == 3  # a count of masks, not a clock: the same three on any machine
    assert index.warm(10_000) == compiled.dfa.num_states - 3  # narrow states first, then the string body
    assert index.warm(10_000) == 0
    for state in range(compiled.dfa.num_states):
        assert np.array_equal(index.cached_mask(state).words, compiled.state_mask(state).words)


def test_byte_automaton_is_the_patterns_own_behind_the_sentinel():
    # built as `\x01` + pattern (outlines-core is far faster that way); the sentinel's state is dropped
    dfa = build_byte_dfa(anchored('"(?:[a-z]|\\\\n)*"'))
    walk = dfa.initial
    for b in b'"ab\\nc"':
        walk = int(dfa.transitions[walk, b])
    assert dfa.finals[walk] and not dfa.finals[dfa.initial]
    assert dfa.transitions[dfa.initial, 0x01] == dfa.dead  # the sentinel is not part of the language
    # a pattern matching the empty string (outlines-core refuses it as a whole): the start state is final
    empty_ok = build_byte_dfa(anchored("a*"))
    assert empty_ok.finals[empty_ok.initial] and empty_ok.transitions[empty_ok.initial, ord("a")] == empty_ok.initial
    with pytest.raises(ValueError):
        build_byte_dfa(anchored("x(?m:^)y"))  # matches nothing
