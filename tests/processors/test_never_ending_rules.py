"""A schema whose recursion never ends matches no document: a root that never ends is refused with the typed error
(naming the loop and the fix), a union branch that never ends is left out of the language (the mask never lets a
model into it), and a recursion with a base case is unaffected (`automaton/productive.py`)."""

from __future__ import annotations

import json

import pytest

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.automaton.formula_arrays import formulas_from_arrays
from hf_paged.processors.automaton.grammar import Grammar, call_regex
from hf_paged.processors.automaton.productive import (
    NOTHING,
    _formula,
    _holds,
    never_ending_rules,
    productivity,
    prune_dead_rules,
)
from hf_paged.processors.schema.ladder import schema_to_grammar
from tests.processors.toy_tokenizers import byte_level_tokenizer, ids_of

TOK = byte_level_tokenizer()
LOOP = {"type": "object", "properties": {"x": {"$ref": "#/$defs/loop"}}, "required": ["x"]}
DEAD_BRANCH = {"anyOf": [{"type": "string"}, {"$ref": "#/$defs/loop"}], "$defs": {"loop": LOOP}}


def test_never_ending_rules_from_the_texts():
    loop = Grammar(call_regex(1), (call_regex(2), f"a{call_regex(1)}"))  # 0 -> 1 -> 2 -> a 1 -> ...
    assert never_ending_rules(loop) == [0, 1, 2]
    with_exit = Grammar(call_regex(1), (f"b|{call_regex(2)}", f"a{call_regex(1)}"))  # 1 may stop at "b"
    assert never_ending_rules(with_exit) == []
    one_dead_branch = Grammar(f"x|{call_regex(1)}", (f"a{call_regex(1)}",))  # rule 1 never ends; the root does
    assert never_ending_rules(one_dead_branch) == [1]


@pytest.mark.parametrize(("text", "ends"), [
    (f"a(?:{call_regex(1)})*", True),  # zero copies
    (f"a(?:{call_regex(1)})?", True),
    (f"a(?:{call_regex(1)}){{0,3}}", True),
    (f"a(?:{call_regex(1)}){{2,3}}", False),
    (f"a(?:{call_regex(1)})+", False),
    (f"(?:a|b(?:c|{call_regex(1)}))d", True),  # a way round the call
    (f"(?:{call_regex(1)}|b{call_regex(1)})d", False),  # the call on every branch
    (f"[a-z(|]{call_regex(1)}", False),  # a class's `(` and `|` are characters, not syntax
    (f"\\(|\\|{call_regex(1)}", True),  # escaped ones too
    (f"a{NOTHING}|{call_regex(1)}", False),  # the empty class matches nothing
])
def test_the_formula_follows_groups_quantifiers_and_alternatives(text, ends):
    grammar = Grammar(text, (f"z{call_regex(1)}",))  # rule 1 never ends
    assert (0 not in never_ending_rules(grammar)) is ends


FORMULA_TEXTS = [
    f"a(?:{call_regex(1)})*", f"a(?:{call_regex(1)}){{0,3}}", f"a(?:{call_regex(1)}){{2,3}}", f"a(?:{call_regex(1)})+",
    f"(?:a|b(?:c|{call_regex(1)}))d", f"(?:{call_regex(1)}|b{call_regex(2)})d", f"[a-z(|]{call_regex(1)}",
    f"\\(|\\|{call_regex(1)}", f"\\\\{call_regex(1)}?", f"x(?:y(?:{call_regex(1)}|{call_regex(2)}z)w|v)*u",
    f"(?:(?:{call_regex(1)})(?:,{call_regex(2)})*)?\\]", f"[\\]({call_regex(2)}]{call_regex(1)}",
    f"(?:{call_regex(1)}{call_regex(2)}|(?:{call_regex(2)})?{call_regex(1)})",
]


@pytest.mark.parametrize("rule_ends", [set(), {1}, {2}, {1, 2}])
def test_the_array_reader_gives_the_token_readers_formulas(rule_ends):
    formulas = formulas_from_arrays(FORMULA_TEXTS)  # (read together: one pass over all of them)
    assert formulas is not None
    for text, formula in zip(FORMULA_TEXTS, formulas, strict=True):
        assert _holds(formula, rule_ends) == _holds(_formula(text), rule_ends), text
    for other_syntax in ("[]a]", "(?P<n>a)", "(a", f"a{NOTHING}"):  # (left to the token reader)
        assert formulas_from_arrays([other_syntax]) is None


def test_a_grammar_without_a_call_cycle_is_not_analysed():
    chain = Grammar(f"a{call_regex(1)}", (f"b{call_regex(2)}", "c"))
    assert productivity(chain).has_cycle is False
    assert prune_dead_rules(chain) is chain  # the very object: the same cache keys and memo entries


def test_dead_rules_are_dropped_and_the_others_renumbered():
    grammar = Grammar(f"x|{call_regex(1)}|{call_regex(2)}", (f"a{call_regex(1)}", f"b{call_regex(2)}?"))
    pruned = prune_dead_rules(grammar)
    assert pruned == Grammar(f"x|{NOTHING}|{call_regex(1)}", (f"b{call_regex(1)}?",))


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 1},
    {"$defs": {"n": {"type": "object", "properties": {"next": {"$ref": "#/$defs/n"}}, "required": ["next"]}},
     "$ref": "#/$defs/n"},
    {"$ref": "#"}, {"anyOf": [{"$ref": "#"}]}, {"allOf": [{"$ref": "#"}]},
    {"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}, "$ref": "#/$defs/a"},
])
def test_a_recursion_with_no_way_out_is_refused_with_the_fix(schema):
    with pytest.raises(UnsatisfiableSchemaError, match=r"never end .*`\$ref`s loop with no branch that stops") as info:
        JSONSchemaLogitsProcessor(schema, TOK).compiled  # noqa: B018 (the translation refuses it)
    assert "make the property optional" in str(info.value) and "non-recursive branch" in str(info.value)


def _walk(compiled, text: str) -> int | None:
    state = compiled.index.get_initial_state()
    for token in ids_of(TOK, text):
        state = compiled.index.get_next_state(state, token)
        if state is None:
            return None
    return state


def test_a_union_branch_that_never_ends_is_left_out():
    compiled = JSONSchemaLogitsProcessor(DEAD_BRANCH, TOK).compiled
    allowed = compiled.index.get_allowed_tokens(compiled.index.get_initial_state())
    assert ids_of(TOK, '"')[0] in allowed
    assert ids_of(TOK, "{")[0] not in allowed  # the dead branch's first byte
    assert _walk(compiled, "{") is None and _walk(compiled, '{"x":') is None
    assert compiled.index.is_final_state(_walk(compiled, '"hi"'))


@pytest.mark.parametrize("schema", [
    {"type": "object", "properties": {"child": {"$ref": "#"}}, "additionalProperties": False},  # optional
    {"anyOf": [{"type": "null"}, {"type": "object", "properties": {"a": {"$ref": "#"}}, "required": ["a"]}]},
    {"type": "array", "items": {"$ref": "#"}, "minItems": 0},
    {"$defs": {"a": {"type": "object", "properties": {"b": {"$ref": "#/$defs/b"}}, "required": ["b"]},  # A -> B -> A
               "b": {"anyOf": [{"type": "integer"}, {"$ref": "#/$defs/a"}]}},  # B's exit: an integer
     "$ref": "#/$defs/a"},
])
def test_a_recursion_with_a_base_case_is_unchanged(schema):
    grammar = schema_to_grammar(schema)
    assert isinstance(grammar, Grammar) and productivity(grammar).has_cycle
    assert prune_dead_rules(grammar) is grammar and NOTHING not in "".join(grammar.texts)
    compiled = JSONSchemaLogitsProcessor(schema, TOK).compiled
    assert compiled.mask(compiled.index.get_initial_state()).num_allowed > 0
    document = {"b": {"b": 3}} if "$defs" in schema else [[], [[]]] if schema.get("type") == "array" else None
    if document is not None:
        state = _walk(compiled, json.dumps(document, separators=(",", ":")))
        assert state is not None and compiled.index.is_final_state(state)


def test_an_engine_request_with_a_dead_branch_finishes_with_a_document():
    import torch

    from hf_paged import Engine, PagedConfig, SamplingParams
    from tests.batching.test_constrained_engine import model_and_tokenizer

    model, tok = model_and_tokenizer()
    schema = {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"$ref": "#/$defs/loop"}],
              "$defs": {"loop": LOOP}}
    proc = JSONSchemaLogitsProcessor(schema, tok)
    engine = Engine(model, PagedConfig(block_size=8))
    params = SamplingParams(max_new_tokens=24, eos_token_id=tok.eos_token_id, logits_processors=[proc])
    prompts = ["Object: {", "Give me a number: ", "a"]  # (before the pruning, the first entered `{` and ran away)
    ids = [engine.add_request(tok(p)["input_ids"], params) for p in prompts]
    outs = engine.run(ids)
    for rid in ids:
        text = tok.decode(outs[rid].generated_tokens, skip_special_tokens=True)
        assert outs[rid].finish_reason == "stop", (text, outs[rid].finish_reason)
        assert json.loads(text) in range(10)
    stock = model.generate(torch.tensor([tok(prompts[0])["input_ids"]]), max_new_tokens=24, do_sample=False,
                           logits_processor=[proc], eos_token_id=tok.eos_token_id, pad_token_id=tok.eos_token_id)
    assert stock[0, len(tok(prompts[0])["input_ids"]):].tolist() == outs[ids[0]].generated_tokens


def test_a_pruning_try_whose_root_never_ends_gives_way_to_the_next_try():
    from types import SimpleNamespace

    from hf_paged.processors.schema import ladder

    rules = (f"a{call_regex(1)}",)  # rule 1 never ends, and the root needs it
    kept_all = SimpleNamespace(num_pruned=0, grammar_rules=lambda: rules)
    with pytest.raises(UnsatisfiableSchemaError, match="never end"):
        ladder._grammar(call_regex(1), kept_all)
    left_out = SimpleNamespace(num_pruned=2, grammar_rules=lambda: rules)  # (perhaps the branch that stopped it)
    with pytest.raises(ladder._PrunedToNothing) as info:
        ladder._grammar(call_regex(1), left_out)
    assert isinstance(info.value.error, UnsatisfiableSchemaError)
