"""A definition the start rule never reaches is still checked for undefined names and recursive terminals, as Lark
checks it (h4 G1): `start: "a"\\nunused: missing` compiled, though the README promises `UndefinedRuleError` for
undefined rules and Lark refuses the grammar."""

from __future__ import annotations

import pytest

from hf_paged.errors import UndefinedRuleError, UnsupportedGrammarError
from hf_paged.processors.lark.compile import compile_lark

lark = pytest.importorskip("lark")


@pytest.mark.parametrize("grammar,error,words", [
    ('start: "a"\nunused: missing', UndefinedRuleError, r"rule 'missing' \(line 2, column 9, in the rule unused\)"),
    ('start: "a"\nunused: MISSING', UndefinedRuleError, r"terminal 'MISSING' .*in the rule unused"),
    ('start: "a"\nA: B', UndefinedRuleError, r"terminal 'B' .*in the terminal A"),
    ('start: "a"\nA: "x" A', UnsupportedGrammarError, r"terminal A refers to itself \(A -> A\)"),
    ('start: "a"\nA: B\nB: "x" A', UnsupportedGrammarError, r"refers to itself \(A -> B -> A\)"),
])
def test_an_unused_definition_is_checked_as_lark_checks_it(grammar, error, words):
    with pytest.raises(lark.exceptions.GrammarError):
        lark.Lark(grammar, parser="earley", lexer="dynamic_complete")
    with pytest.raises(error, match=words):
        compile_lark(grammar)


@pytest.mark.parametrize("grammar", [
    'start: "a"\nunused: "b" B\nB: "c"',  # defined names, only unused
    'start: NUMBER\n%import common.NUMBER\nunused: NUMBER',  # an imported terminal
])
def test_an_unused_definition_of_defined_names_is_fine(grammar):
    lark.Lark(grammar, parser="earley", lexer="dynamic_complete")
    assert compile_lark(grammar).constraint
