"""A grammar's rules (`grammar_rules`): counted and checked at compile, each rule's table written on its first need,
the same table, finals and call edges as an automaton built at once; calls to missing rules refused at compile."""

from __future__ import annotations

import mmap

import numpy as np
import pytest

from hf_paged.errors import InvalidRegexError
from hf_paged.processors.automaton import anchored, build_byte_dfa
from hf_paged.processors.automaton import grammar_rules as rules_module
from hf_paged.processors.automaton.grammar import MARK, Grammar, call_regex
from hf_paged.processors.automaton.grammar_dfa import GrammarDFA
from hf_paged.processors.automaton.lazy_zeros import lazy_zeros_many
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.schema import schema_to_grammar

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "tags": {"type": "array", "items": {"$ref": "#/$defs/tag"}},
    "child": {"$ref": "#"}}, "$defs": {"tag": {"type": "object", "properties": {"k": {"type": "string"}}}}}


def _fresh(grammar: Grammar, budget: CompileBudget | None = None) -> list:
    rules_module._RULES.clear()
    rules_module._TEXTS.clear()
    return rules_module.grammar_rules(grammar, budget)


def test_tables_wait_for_their_first_need_and_equal_an_eager_build():
    grammar = schema_to_grammar(SCHEMA)
    assert isinstance(grammar, Grammar) and len(grammar.rules) >= 1
    rules = _fresh(grammar)
    # counted and checked, nothing written yet (but a rule whose text has a mark byte that is not a call: its call
    # edges checked on its table)
    waiting = [rule._table is None for rule in rules]
    assert waiting == ["\\x02\\x02" not in text for text in grammar.texts] and sum(waiting) >= 3
    dfa = GrammarDFA(grammar)
    assert dfa.accepts(b'{"name": "a", "child": {"tags": [{"k": "b"}]}}')
    for text, rule in zip(grammar.texts, rules):
        eager = build_byte_dfa(anchored(text), fresh=True)
        table = eager.transitions.copy()
        calls = rules_module._call_edges(table, eager.dead)
        if calls:
            table[:, MARK] = eager.dead
        assert np.array_equal(rule.table, table) and np.array_equal(rule.finals, eager.finals)
        assert rule.dead == eager.dead and rule.calls == calls
        assert np.array_equal(rule.has_calls, np.isin(np.arange(table.shape[0]), list(calls)))


def test_the_same_work_is_counted_whether_or_not_a_table_was_written():
    grammar = schema_to_grammar(SCHEMA)
    first = CompileBudget()
    rules = _fresh(grammar, first)
    for rule in rules:
        rule.table  # noqa: B018 (written)
    again = CompileBudget()
    rules_module._RULES.clear()
    rules_module.grammar_rules(grammar, again)  # (memoised by text, tables written)
    fresh = CompileBudget()
    _fresh(grammar, fresh)
    assert first.work == again.work == fresh.work > 0


def test_calls_to_missing_rules_are_refused_at_compile():
    with pytest.raises(InvalidRegexError, match="calls rule 3"):
        _fresh(Grammar(f"a{call_regex(3)}", ("b",)))
    with pytest.raises(InvalidRegexError, match="calls rule 0"):
        _fresh(Grammar("a\\x02\\x0e\\x0e\\x0e", ("b",)))
    # a mark byte spelled another way than `call_regex` does (outside grammar.py's contract): the automaton's own
    # call edges are checked, its table written at once
    with pytest.raises(InvalidRegexError, match="calls rule 5"):
        _fresh(Grammar("a[\\x02][\\x0e][\\x0e][\\x13]", ("b",)))
    rules = _fresh(Grammar(f"a{call_regex(1)}c", ("b",)))
    assert rules[0]._table is None and rules[0].calls and rules[0].has_calls.sum() == 1


def test_lazy_zeros_many_shares_one_mapping_and_keeps_arrays_apart():
    big = 1 << 20
    wide, flags, small, counts = lazy_zeros_many(((big // 4, 4), np.int32), (big, np.bool_), (10, np.int64),
                                                  (big // 8 + 3, np.int64))
    assert wide.shape == (big // 4, 4) and flags.shape == (big,) and small.shape == (10,)
    assert not wide.any() and not flags.any() and not small.any() and not counts.any()
    wide[-1, -1], flags[0], counts[-1] = 7, True, 9
    assert wide.sum() == 7 and flags.sum() == 1 and counts.sum() == 9 and small.sum() == 0
    assert isinstance(wide.base.obj if isinstance(wide.base, memoryview) else wide.base, (mmap.mmap, np.ndarray))
    for array in (wide, flags, counts):  # (each from a page boundary of the one mapping)
        assert array.ctypes.data % mmap.PAGESIZE == 0
