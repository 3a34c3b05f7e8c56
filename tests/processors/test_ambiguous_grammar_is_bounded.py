"""An ambiguous grammar's automaton state holds one call stack per way to parse the text so far; with
`a: "x" a? a?` those ways grow like Fibonacci with each `x` (7k stacks after 18 bytes, a row then costs seconds and
the next one twice that), so a model that writes `xxxx...` stalled the mask for minutes. A row that would step more
than `max_configurations` stacks raises `SchemaTooComplexError` (a count, the same on every machine), as a
generation that needs more than `capacity` states does. Found by h99's differential fuzz of random Lark grammars."""

from __future__ import annotations

import pytest

from hf_paged.errors import SchemaTooComplexError
from hf_paged.processors.automaton import build_automaton
from hf_paged.processors.automaton.grammar_dfa import MAX_CONFIGURATIONS, GrammarDFA
from hf_paged.processors.lark import compile_lark

AMBIGUOUS = 'start: a\na: "x" a? a?\n'


def _walk(dfa: GrammarDFA, text: bytes) -> int:
    state = dfa.initial
    for byte in text:
        dfa.ensure_one(state)
        state = int(dfa.transitions[state, byte])
    dfa.ensure_one(state)
    return state


def test_a_row_over_the_stack_limit_is_refused_by_a_count():
    dfa = build_automaton(compile_lark(AMBIGUOUS).constraint)
    assert isinstance(dfa, GrammarDFA) and dfa.max_configurations == MAX_CONFIGURATIONS
    assert dfa.accepts(b"xxxxxx") and not dfa.accepts(b"")  # short texts: a few hundred stacks at most
    with pytest.raises(SchemaTooComplexError, match="call stacks .limit 1,024.*ambiguous"):
        _walk(dfa, b"x" * 24)


def test_the_limit_is_a_parameter_and_an_unambiguous_grammar_stays_far_under_it():
    dfa = GrammarDFA(compile_lark(AMBIGUOUS).constraint, max_configurations=8)
    with pytest.raises(SchemaTooComplexError, match="limit 8"):
        _walk(dfa, b"xxxxxx")
    nested = GrammarDFA(compile_lark('start: a\na: "(" a? ")"\n').constraint, max_configurations=8)
    assert nested.finals[_walk(nested, b"(" * 40 + b")" * 40)]
