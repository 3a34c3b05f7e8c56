"""Multi-line anchors (`(?m)^`, `(?m)$`) are built by outlines-core behind a sentinel byte; with `\\x01` as that
byte a multi-line `^` never matched at the text's start (it matches after a newline), so `(?m)^\\d+$` was refused as
"incompatible with the vocabulary". A pattern that may turn multi-line mode on gets `\\n` as its sentinel. Found by
h99's differential pass against Python's `re`."""

from __future__ import annotations

import pytest

from hf_paged.processors.automaton import anchored, build_byte_dfa

CASES = [
    ("(?m)^a$", [b"a"], [b"", b"a\n", b"\na"]),
    ("(?m)^[0-9]+$", [b"12"], [b"", b"1\n2"]),
    ("(?m)^a$\n^b$", [b"a\nb"], [b"ab", b"a\n"]),
    ("(?im)^ab(?:\n^cd)*$", [b"AB", b"ab\nCD\ncd"], [b"ab\n", b"ab\ncd\n"]),
    ("(?m:^x)y", [b"xy"], [b"y", b"\nxy"]),
]


@pytest.mark.parametrize("regex, accepted, refused", CASES)
def test_a_multi_line_start_anchor_matches_at_the_start_of_the_text(regex, accepted, refused):
    dfa = build_byte_dfa(anchored(regex), fresh=True)
    assert all(dfa.accepts(text) for text in accepted), regex
    assert not any(dfa.accepts(text) for text in refused), regex


@pytest.mark.parametrize("regex, accepted, refused", [
    ("(?i)^(yes|no)$", [b"YES", b"no"], [b"", b"yesno"]),
    ("^(?i)a", [b"A", b"a"], [b"b"]),
    ("(?i)\\Aab", [b"AB"], [b"b"]),
    ("(?i)^a|b", [b"a", b"B"], [b"ab"]),
    ("(?xi)^a # c", [b"A"], [b"a # c"]),
])
def test_a_leading_start_anchor_is_read_as_the_start_of_the_text(regex, accepted, refused):
    """outlines-core cannot build a start anchor ("anchored universal start state doesn't exist"); a leading one (after
    flag groups) is at the start of the text, where it holds, so it is dropped: `(?i)^(yes|no)$` was refused."""
    dfa = build_byte_dfa(anchored(regex), fresh=True)
    assert all(dfa.accepts(text) for text in accepted), regex
    assert not any(dfa.accepts(text) for text in refused), regex
