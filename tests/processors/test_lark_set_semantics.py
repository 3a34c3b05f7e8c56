"""Where Lark's Earley `dynamic_complete` lexer and our automaton part (found by differential fuzzing against Lark
1.3.1): Lark reads a regex terminal as the match Python's `re` prefers and its prefixes, and an `%ignore` pattern by
its longest match; we read both as the sets of strings they match. The language is the grammar's: Lark refuses
these sentences, we accept them (documented in `grammar_lark.py` and the README), never the reverse."""

from __future__ import annotations

import pytest

from hf_paged.processors.automaton import build_automaton
from hf_paged.processors.lark import compile_lark

ALTERNATION = 'start: A "b"\nA: /a|ab/\n'
LAZY = 'start: A "b"\nA: /a+?/\n'
IGNORED_RUN = 'start: "a" " " "b"\n%import common.WS\n%ignore WS\n'

CASES = [(ALTERNATION, "abb"), (ALTERNATION, "ab"), (LAZY, "aab"), (IGNORED_RUN, "a\t b"), (IGNORED_RUN, "a\n b"),
         (IGNORED_RUN, "a \tb")]


@pytest.mark.parametrize("grammar, text", CASES)
def test_terminals_and_ignored_text_are_sets_of_strings(grammar, text):
    dfa = build_automaton(compile_lark(grammar, "start", max_ignored=None).constraint)
    assert dfa.accepts(text.encode())
    assert not dfa.accepts(text.encode() + b"!")


@pytest.mark.parametrize("grammar, text, lark_reads_it", [(ALTERNATION, "abb", False), (ALTERNATION, "ab", True),
                                                           (LAZY, "aab", False), (IGNORED_RUN, "a\t b", False),
                                                           (IGNORED_RUN, "a \tb", True)])
def test_where_lark_parts_from_the_set_reading(grammar, text, lark_reads_it):
    """What the docs say of Lark's lexer (if a Lark release reads these texts, drop the caveat there)."""
    lark = pytest.importorskip("lark")
    parser = lark.Lark(grammar, parser="earley", lexer="dynamic_complete")
    try:
        parser.parse(text)
        parsed = True
    except lark.exceptions.LarkError:
        parsed = False
    assert parsed is lark_reads_it
