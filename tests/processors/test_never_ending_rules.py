"""A schema whose `$ref`s loop with no way out matches no document: the error says so (it blamed the tokenizer's
vocabulary before), and a recursion with a base case is unaffected."""

from __future__ import annotations

import pytest

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.automaton.grammar import Grammar, call_regex
from hf_paged.processors.automaton.grammar_rules import grammar_rules, rules_that_never_end
from tests.processors.toy_tokenizers import byte_level_tokenizer

TOK = byte_level_tokenizer()


def test_rules_that_never_end():
    loop = Grammar(call_regex(1), (call_regex(2), f"a{call_regex(1)}"))  # 0 -> 1 -> 2 -> a 1 -> ...
    assert rules_that_never_end(grammar_rules(loop)) == [0, 1, 2]
    with_exit = Grammar(call_regex(1), (f"b|{call_regex(2)}", f"a{call_regex(1)}"))  # 1 may stop at "b"
    assert rules_that_never_end(grammar_rules(with_exit)) == []
    one_dead_branch = Grammar(f"x|{call_regex(1)}", (f"a{call_regex(1)}",))  # rule 1 never ends; the root does
    assert rules_that_never_end(grammar_rules(one_dead_branch)) == [1]


@pytest.mark.parametrize("schema", [{"$ref": "#"}, {"anyOf": [{"$ref": "#"}]}, {"allOf": [{"$ref": "#"}]},
                                    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                                     "$ref": "#/$defs/a"}])
def test_a_ref_loop_with_no_way_out_is_named(schema):
    processor = JSONSchemaLogitsProcessor(schema, TOK)
    with pytest.raises(UnsatisfiableSchemaError, match=r"never end .*`\$ref`s loop with no branch that stops"):
        processor.compiled  # noqa: B018 (waits for the index)


def test_a_recursion_with_a_base_case_compiles():
    schema = {"type": "object", "properties": {"child": {"$ref": "#"}}, "additionalProperties": False}
    processor = JSONSchemaLogitsProcessor(schema, TOK)
    assert processor.compiled.mask(processor.compiled.index.get_initial_state()).num_allowed > 0
