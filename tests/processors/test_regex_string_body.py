"""A regex hole between JSON quotes reads its regex as Rust does, like every other user regex (h4 P10): it went
through a schema `pattern` (ECMA-262 / Python's `re`), so `[a-z&&[^aeiou]]{3}` gave 'a]]]' (Python's class
`[a-z&&[^aeiou]` and a literal ']'), `[[:digit:]]{2}` 't]]', `[a-c--b]{2}` 'ab', with Python's FutureWarnings, and
`\\x{41}` / `(?U)` were refused with an error naming '#/pattern'."""

from __future__ import annotations

import json
import warnings

import pytest

from hf_paged.errors import UnsupportedSchemaError
from hf_paged.processors.automaton.byte_dfa import anchored, build_byte_dfa
from hf_paged.processors.schema import regex_string_body


def _body_accepts(pattern: str, value: str) -> bool:
    """Whether the hole's body regex accepts `value` written as a JSON string body."""
    body = regex_string_body(pattern)
    return build_byte_dfa(anchored(body)).accepts(json.dumps(value, ensure_ascii=False)[1:-1].encode())


@pytest.mark.parametrize("pattern,good,bad", [
    (r"[a-z&&[^aeiou]]{3}", ["frr", "xbc"], ["a]]]", "aei", "fr"]),  # class intersection
    (r"[[:digit:]]{2}", ["10", "99"], ["t]]", ":d"]),  # ASCII class
    (r"[\d&&[^0-4]]{2}", ["88", "59"], ["1]]", "14"]),
    (r"[a-c--b]{2}", ["ac", "ca"], ["ab", "bb"]),  # class difference
    (r"[a-z~~c]{2}", ["ab", "zz"], ["cc", "ac"]),  # symmetric difference
    (r"\x{41}{2}", ["AA"], ["x{41}"]),  # braced hex escape
    (r"(?U)a+", ["a", "aaa"], ["", "b"]),  # swap-greed flag (same language)
    (r"\p{Greek}+", ["αβ"], ["ab"]),  # Unicode class (outlines-core builds it)
    (r'[a-z]"', ['a"'], ["a", 'a\\"']),  # a quote the body escapes
    (r"^ab$|^c$", ["ab", "c"], ["abc", ""]),  # anchors at the ends: the whole value is matched anyway
    (r".\n", ["x\n", "é\n"], ["x"]),  # a control character written as its escape
])
def test_a_regex_hole_body_follows_rust_syntax(pattern, good, bad):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Python's "Possible set intersection" FutureWarnings leaked
        for value in good:
            assert _body_accepts(pattern, value), value
        for value in bad:
            assert not _body_accepts(pattern, value), value


@pytest.mark.parametrize("pattern,words", [
    (r"(?i).+", "Rust-only syntax .* may match a quote"),  # Rust-only, and '.' holds '"', '\' and controls
    (r"\P{L}", "Rust-only syntax"),
    (r"a^b", "an anchor .* inside it"),
])
def test_what_a_body_cannot_hold_is_refused_naming_the_regex(pattern, words):
    with pytest.raises(UnsupportedSchemaError, match=words) as caught:
        regex_string_body(pattern)
    assert repr(pattern) in str(caught.value) and "#/pattern" not in str(caught.value)

