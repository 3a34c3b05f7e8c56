"""Refusals say what is wrong with the user's pattern (h4 P2, R2, G1): an empty class `[a&&b]` was an
InvalidRegexError quoting outlines-core's "vocabulary incompatible ... encoding issue in your vocabulary" (`[^\\s\\S]`
was already "matches no text"); `(?-u:.)` and `(?-u:\\xff)` got Python's "bad inline flags" beside "use Rust regex
syntax"; a Lark terminal `/[^\\s\\S]/` was "matches only control characters 0x02/0x0E..0x1F" though it matches
nothing; and Python's FutureWarnings about set operations leaked from a Rust class Python cannot read."""

from __future__ import annotations

import warnings

import pytest

from hf_paged.errors import InvalidRegexError, UnsatisfiableSchemaError
from hf_paged.processors.automaton import build_automaton, validate_regex
from hf_paged.processors.lark.compile import compile_lark


@pytest.mark.parametrize("pattern", [r"[a&&b]", r"x[a&&b]", r"(?i)[a&&b]"])
def test_an_empty_class_is_unsatisfiable_not_a_vocabulary_problem(pattern):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UnsatisfiableSchemaError, match="matches no text") as caught:
            validate_regex(pattern)
    assert "vocabulary" not in str(caught.value) and repr(pattern) in str(caught.value)


@pytest.mark.parametrize("pattern", [r"(?-u:.)", r"(?-u:\xff)", r"(?s-u:.)", r"(?-u)[\x80-\xff]"])
def test_byte_mode_that_matches_non_utf8_is_refused_as_byte_mode(pattern):
    with pytest.raises(InvalidRegexError, match=r"byte mode \(\?-u\)") as caught:
        validate_regex(pattern)
    assert "bad inline flags" not in str(caught.value)


@pytest.mark.parametrize("pattern,accepted", [(r"(?-u:\w)+", "ab_"), (r"(?-u:\b)foo(?-u:\b)", "foo")])
def test_byte_mode_over_ascii_is_taken(pattern, accepted):
    validate_regex(pattern)
    assert build_automaton(pattern).accepts(accepted.encode())


def test_pipes_in_a_class_beside_a_perl_class_leak_no_warning():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Python's parser warned "Possible set union"
        dfa = build_automaton(r"[\d||x]")
    assert [t for t in ("|", "5", "x", "||") if dfa.accepts(t.encode())] == ["|", "5", "x"]


def test_a_lark_terminal_of_an_empty_class_matches_nothing():
    with pytest.raises(UnsatisfiableSchemaError, match="matches no text"):
        validate_regex(compile_lark('start: A\nA: /[^\\s\\S]/', "start").constraint)
    dfa = build_automaton(compile_lark('start: A | "b"\nA: /[^\\s\\S]/', "start").constraint)
    assert [t for t in ("b", "", "A") if dfa.accepts(t.encode())] == ["b"]
