"""A pattern in verbose mode (`(?x)`) that ends with a comment, in syntax outlines-core builds (`(?i)`, `\\p{..}`):
the comment ran to the end of the line and swallowed the `)\\z` our wrapping closes it with, so a valid Rust regex
was refused ("Failed to build DFA"). Found by h99's differential pass over the regex compiler."""

from __future__ import annotations

import pytest

from hf_paged.processors.automaton import anchored, build_byte_dfa

CASES = [
    ("(?xi)a # one letter", [b"a", b"A"], [b"ab", b"a # one letter", b""]),
    ("(?x)\\pL # a letter", [b"a", "\u00e9".encode()], [b"ab", b"1"]),
    ("(?i)a#", [b"a#", b"A#"], [b"a"]),  # not verbose: `#` is a literal, the closing changes nothing
    ("(?i)a(?x:b # c\n)#", [b"Ab#"], [b"ab", b"Ab"]),
]


@pytest.mark.parametrize("regex, accepted, refused", CASES)
def test_a_verbose_comment_at_the_end_does_not_swallow_the_anchor(regex, accepted, refused):
    dfa = build_byte_dfa(anchored(regex), fresh=True)
    assert all(dfa.accepts(text) for text in accepted), regex
    assert not any(dfa.accepts(text) for text in refused), regex
