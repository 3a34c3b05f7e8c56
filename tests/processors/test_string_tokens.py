"""String bodies without the trie walk (`utf8`, `string_steps`, `string_tokens`): the UTF-8 facts, the steps
of plain and counted bodies, the per-vocabulary split, and masks equal to outlines-core's eager `Index`."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_paged.processors.automaton import anchored
from hf_paged.processors.automaton.byte_dfa import build_byte_dfa
from hf_paged.processors.automaton.string_steps import UNBOUNDED, BodySteps
from hf_paged.processors.automaton.utf8 import multibyte_ends, valid_utf8_suffixes
from hf_paged.processors.index.string_tokens import body_tokens
from hf_paged.processors.index.token_trie import build_token_trie
from hf_paged.processors.index.token_walk import TrieWalk
from hf_paged.processors.schema import schema_to_regex
from tests.processors.test_token_index import MULTI, SINGLE, check_against_eager, make_vocab

JSON_BODY = '"(?:[^"\\\\\\x00-\\x1f]|\\\\["\\\\/bfnrt])*"'  # a JSON string: quote, body (escapes too), quote


def _cut_short_ok(raw: bytes) -> bool:
    """Reference: `raw` plus some completion of its last character is well-formed UTF-8 (Python's strict decoder;
    its incremental mode does not check the second byte of a cut-short E0/ED/F0/F4 character)."""
    for completion in [bytes([x]) * k for x in (0x80, 0x90, 0xA0) for k in range(4)]:
        try:
            (raw + completion).decode("utf-8")
        except UnicodeDecodeError:
            continue
        return True
    return False


def _after_quote(dfa) -> int:
    return int(dfa.transitions[dfa.initial, ord('"')])


def test_valid_suffixes_by_hand():
    assert valid_utf8_suffixes(b"a\xc3\xa9") == [True, True, False, True]  # "aé": the continuation byte alone is not
    assert valid_utf8_suffixes(b"\xe2\x80") == [True, False, True]  # cut short after two of three bytes
    assert valid_utf8_suffixes(b"\xe0\x80") == [False, False, True]  # overlong: E0 needs A0..BF next
    assert valid_utf8_suffixes(b"\xed\xa0") == [False, False, True]  # a surrogate
    assert valid_utf8_suffixes(b"\xf4\x90") == [False, False, True]  # past U+10FFFF
    assert valid_utf8_suffixes(b"\xc0\xaf") == [False, False, True]  # C0 never starts a character
    assert valid_utf8_suffixes(b"\xc3(") == [False, True, True]  # lead byte, then no continuation


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=8) | st.text(max_size=4).map(lambda t: t.encode("utf-8")))
def test_valid_suffixes_match_pythons_decoder(raw):
    assert valid_utf8_suffixes(raw) == [_cut_short_ok(raw[i:]) for i in range(len(raw) + 1)]


def test_multibyte_ends():
    for regex, returns in [(JSON_BODY, True), ('"[^"]*"', True), ('"[a-z]*"', False), ('"[^é"]*"', False)]:
        dfa = build_byte_dfa(anchored(regex))
        body = _after_quote(dfa)
        ends = multibyte_ends(dfa.transitions)
        assert bool(ends[body] == body) is returns, regex
        assert ends[dfa.initial] == dfa.dead and ends[dfa.dead] == dfa.dead  # only a quote may start; dead stays
    counted = build_byte_dfa(anchored('"[^"]{0,2}"'))
    first = _after_quote(counted)
    second = int(counted.transitions[first, ord("a")])
    assert multibyte_ends(counted.transitions)[first] == second  # "é" is one character, like "a"


def test_steps_of_plain_and_counted_bodies():
    plain = build_byte_dfa(anchored(JSON_BODY))
    steps = BodySteps(plain.transitions, plain.dead)
    body = _after_quote(plain)
    assert steps.steps_of(body) == UNBOUNDED
    bits, target, multibyte = steps.body_of(body)
    assert target == body and multibyte and bits == sum(1 << b for b in range(0x20, 0x80) if b not in b'"\\')
    # the opening quote is a "body" of one byte: '""' is two steps of it (the string's body sends '"' on alone)
    assert steps.body_of(plain.initial)[0] == 1 << ord('"') and steps.steps_of(plain.initial) == 2
    assert steps.steps_of(plain.dead) == 0
    counted = build_byte_dfa(anchored('"[^"]{0,3}"'))
    steps = BodySteps(counted.transitions, counted.dead)
    chain = [_after_quote(counted)]
    for _ in range(3):
        chain.append(steps.body_of(chain[-1])[1])
    # the last takes only the closing quote: a body of its own, one byte, one step
    assert [steps.steps_of(s) for s in chain] == [3, 2, 1, 1]
    assert steps.body_of(chain[3])[0] == 1 << ord('"') and steps.body_of(chain[2])[0] == steps.body_of(chain[0])[0]
    assert steps.after(chain[0], 3) == chain[3]


def test_body_split_of_a_small_vocabulary():
    keys = [b"ab", b"a\xc3\xa9", b"\xc3", b'a"', b"\\n", b"\xa9", b"abc", b"\n"]
    vocab = make_vocab(keys)
    trie = build_token_trie(vocab.tokens, vocab.vocab_size)
    json_ascii = sum(1 << b for b in range(0x20, 0x80) if b not in b'"\\')
    split = body_tokens(trie, json_ascii, True)
    assert body_tokens(trie, json_ascii, True) is split  # memoised per vocabulary
    raw_at = trie.pos_bytes
    assert {raw_at[p]: int(c) for p, c in enumerate(split.chars) if c >= 0} == {
        b"ab": 2,
        b"a\xc3\xa9": 2,
        b"\xc3": 1,
        b"abc": 3,
    }
    assert sorted(raw_at[p] for p in split.other_positions.tolist()) == sorted([b'a"', b"\\n", b"\xa9", b"\n"])
    no_multibyte = body_tokens(trie, json_ascii, False)
    assert {raw_at[p] for p, c in enumerate(no_multibyte.chars) if c >= 0} == {b"ab", b"abc"}
    dfa = build_byte_dfa(anchored(JSON_BODY + ",?"))
    kept = TrieWalk(dfa, trie)._others_alive(split, _after_quote(dfa))
    assert sorted(raw_at[p] for p in kept.tolist()) == [b"\\n", b'a"']  # "\n" and a lone continuation die


# a vocabulary heavy in non-ASCII tokens: complete characters, cut-short ones, malformed ones, quotes inside
UTF8_TOKENS = SINGLE + MULTI + [
    "é".encode() * 3, "日本".encode(), "日本"[0].encode()[:2], "😀".encode(), "😀".encode()[:3], b"a" + "😀".encode(),
    b"\xed\xa0\x80", b"\xe0\x80\x80", b"\xf4\x90\x80\x80", b"\xc3(", b"a\xa9b", "é\"".encode(), "é\",".encode(),
    b"ab\\", b'\\"', "\\\"é".encode(), b"\xc3\xa9\xc3", b"\xa9\xc3\xa9", "x\tя".encode(), "€€".encode(), b"abcd",
    b"abcdefgh", b"abc", "aé€".encode(), b'ab",', b"zz", b"mn", b"nz", "abé".encode(), "abéé".encode(),
]  # fmt: skip
UTF8_VOCAB = make_vocab(UTF8_TOKENS)
COUNTED = {"type": "object", "properties": {"s": {"type": "string"}, "t": {"type": "string", "maxLength": 4}}}
REGEXES = [
    JSON_BODY, '"[^"]*"', '"[^é"]*"', '"[^"]{0,3}"', '"[^"]{2,5}",?', "[a-z]{1,3}[a-m]*", "[a-z]{1,2}", '"[^"]{0,2}[a-c]*"',
    schema_to_regex(COUNTED), '"(?:[b-z][a-z]*|a)"', '"(?:[^"\\\\a][^"\\\\]*|ab?)"',
    '"[^"]{0,2}é*"',  # past the count only multi-byte characters go on: a longer token is not banned outright
]  # fmt: skip


def test_masks_equal_the_eager_index_with_body_tokens():
    for regex in REGEXES:
        assert check_against_eager(regex, UTF8_VOCAB, narrow_bytes=0) > 2, regex
        assert check_against_eager(regex, UTF8_VOCAB, narrow_bytes=16) > 2, regex


def test_body_tokens_decide_string_bodies_and_give_way_elsewhere():
    trie = build_token_trie(UTF8_VOCAB.tokens, UTF8_VOCAB.vocab_size)

    def decided(regex: str, state: int) -> bool:
        walk = TrieWalk(build_byte_dfa(anchored(regex)), trie, narrow_bytes=0)
        found = walk._body_allowed(state)
        if found is not None:  # and then it says what the trie walk says
            walk.use_bodies = False
            assert sorted(found.tolist()) == sorted(np.asarray(walk.allowed(state)).tolist())
        return found is not None

    for regex in (JSON_BODY, '"[^"]{0,3}"'):
        assert decided(regex, _after_quote(build_byte_dfa(anchored(regex))))
    # `[a-z]{1,3}[a-m]*`: past three letters the state still takes a-m, so a long token is not banned outright
    assert not decided("[a-z]{1,3}[a-m]*", 0)
    # a key's first character (b-z), then the key's body ([a-z]*): decided on the first byte
    key = '"(?:[b-z][a-z]*|a)"'
    walk = TrieWalk(build_byte_dfa(anchored(key)), trie, narrow_bytes=0)
    first = _after_quote(build_byte_dfa(anchored(key)))
    assert walk._body.steps_of(first) == 1 and walk._first_byte_allowed(first) is not None
    assert decided(key, first)
    # the opening quote: a one-byte body two steps long ('""'), a third quote dies: decided, and right
    assert decided('"[^"]{0,3}"', 0)


BODY_ATOMS = st.sampled_from(['[^"]', "[a-z]", "[^a]", '[^é"]', '"', "a", "é", "[0-9]", "\\\\n", " "])


@settings(max_examples=40, deadline=None)
@given(
    st.lists(
        st.tuples(BODY_ATOMS, st.sampled_from(["", "*", "+", "?", "{0,2}", "{1,3}", "{0,5}", "{2}"])),
        min_size=1,
        max_size=4,
    )
)
def test_random_body_chains_match_the_eager_index(parts):
    """Bodies next to bodies: chains that end in another body, counted runs that share states, loops."""
    regex = "".join(f"(?:{atom}){count}" for atom, count in parts)
    check_against_eager(regex, UTF8_VOCAB, narrow_bytes=0)
    check_against_eager(regex, UTF8_VOCAB, narrow_bytes=16)


def test_a_body_with_too_many_other_tokens_is_left_to_the_trie_walk(monkeypatch):
    import hf_paged.processors.index.string_tokens as module

    monkeypatch.setattr(module, "MAX_OTHERS", 5)
    trie = build_token_trie(UTF8_VOCAB.tokens, UTF8_VOCAB.vocab_size)
    split = body_tokens(trie, module.JSON_STRING_ASCII, True)
    assert not split.complete and split.other_flat.shape == (0,)
    dfa = build_byte_dfa(anchored(JSON_BODY))
    assert TrieWalk(dfa, trie, narrow_bytes=0)._body_allowed(_after_quote(dfa)) is None
    for regex in (JSON_BODY, '"(?:[b-z][a-z]*|a)"'):
        assert check_against_eager(regex, UTF8_VOCAB, narrow_bytes=0) > 2
