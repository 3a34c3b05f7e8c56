"""The walk's loop shortcut (a subtree taken whole when every byte below a node loops on the state) must weigh
every byte of the subtree, lone UTF-8 lead bytes (0xC0-0xFF) included.

`test_token_index`'s random regexes reach such a state only by chance: here fixed patterns whose looping states sit
above `b"a\\xc3"` (a letter then a lone lead byte, as byte-level vocabularies have), checked state by state against
outlines-core's eager index, through the compiled walk (narrow states and wide ones) and the Python walk.
"""

from __future__ import annotations

import pytest

from tests.processors.test_token_index import MULTI, SINGLE, TOY, check_against_eager

A_LEAD = 1 + len(SINGLE) + MULTI.index(b"a\xc3")  # the id of b"a\xc3"


@pytest.mark.parametrize("regex", ["a*b", "(?:[a-c])+", "[a-z]*!", "(?:ab|a)*c"])
@pytest.mark.parametrize("narrow_bytes", [0, 4, 16, 256])
def test_a_looping_state_above_a_lone_lead_byte_matches_the_eager_index(regex, narrow_bytes):
    assert check_against_eager(regex, TOY, narrow_bytes=narrow_bytes) > 1


def test_a_letter_then_a_lone_lead_byte_is_refused_where_only_letters_loop():
    from hf_paged.processors.automaton import anchored
    from hf_paged.processors.automaton.byte_dfa import build_byte_dfa
    from hf_paged.processors.index.token_index import TokenIndex
    from hf_paged.processors.index.token_trie import build_token_trie

    trie = build_token_trie(TOY.tokens, TOY.vocab_size)
    for narrow_bytes in (0, 16, 256):
        index = TokenIndex(build_byte_dfa(anchored("[a-c]+")), TOY, trie, narrow_bytes=narrow_bytes)
        index._walk.compiled_narrow = narrow_bytes < 256
        state = index.get_next_state(index.get_initial_state(), 1 + ord("a"))
        allowed = index.get_allowed_tokens(state)
        assert 1 + ord("a") in allowed and A_LEAD not in allowed, narrow_bytes
