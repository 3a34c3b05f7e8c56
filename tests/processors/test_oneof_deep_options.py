"""A `oneOf` option is never read as matching nothing because it is deep: `allOf` / `$ref` chains merge to any depth
(each round past the first 16 a visit of the work budget), and an option cut off by the recursion limit is still
excluded from its siblings as the schema it stands for (`translate.branches`, `oneof.narrow_exclusive`)."""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.errors import UnsatisfiableSchemaError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import accepts, byte_level_tokenizer

jsonschema = pytest.importorskip("jsonschema")


def _nested_all_of(inner: dict, depth: int) -> dict:
    for _ in range(depth):
        inner = {"allOf": [inner]}
    return inner


def _ref_chain(inner: dict, hops: int) -> tuple[dict, dict]:
    """($defs of a chain of `hops` references ending at `inner`, the reference to its first link)."""
    defs: dict = {f"d{i}": {"$ref": f"#/$defs/d{i + 1}"} for i in range(hops)}
    defs[f"d{hops}"] = inner
    return defs, {"$ref": "#/$defs/d0"}


def _assert_verdicts(schema: dict, texts: dict[str, bool]) -> None:
    """Each text is valid per jsonschema exactly as written in `texts`, and the regex accepts exactly the valid ones."""
    validator = jsonschema.Draft202012Validator(schema)
    rx = schema_to_regex(schema)
    for text, valid in texts.items():
        assert validator.is_valid(json.loads(text)) is valid, text  # (the case is what it says)
        assert bool(re.fullmatch(rx, text)) is valid, text


@pytest.mark.parametrize("depth", [1, 16, 17, 40])
def test_a_deep_all_of_option_still_excludes_its_sibling(depth):
    """17 levels used to leave the first option empty: `{"a": 1}`, which satisfies both options, was accepted."""
    deep = _nested_all_of({"type": "object", "required": ["a"]}, depth)
    _assert_verdicts({"oneOf": [deep, {"type": "object"}]}, {'{"a":1}': False, "{}": True, '{"b":1}': True})


def test_options_that_always_overlap_are_unsatisfiable_at_any_depth():
    deep = _nested_all_of({"type": "integer"}, 17)
    with pytest.raises(UnsatisfiableSchemaError):  # (every integer satisfies both: nothing is valid)
        schema_to_regex({"oneOf": [deep, {"type": "integer"}]})


@pytest.mark.parametrize("hops", [3, 16, 30])
def test_a_long_ref_chain_option_still_excludes_its_sibling(hops):
    """Past 16 hops the chain's option was empty, so the other was not narrowed (made to require `k`)."""
    defs, ref = _ref_chain({"type": "object", "required": ["a"], "properties": {"k": {"const": 1}}}, hops)
    schema = {"$defs": defs, "oneOf": [ref, {"type": "object", "properties": {"k": {"const": 2}}}]}
    _assert_verdicts(schema, {'{"a":1}': False, '{"k":1,"a":1}': True, '{"k":2}': True, '{"k":2,"a":1}': True})


def test_deep_all_of_bounds_are_kept_not_dropped():
    """Outside `oneOf` the cut made the whole schema 'unsatisfiable'."""
    schema: dict = {"type": "integer"}
    for i in range(30):
        schema = {"allOf": [schema], "minimum": -i}
    _assert_verdicts(schema, {"0": True, "7": True, "-1": False})


def test_deep_merges_count_against_the_work_budget():
    deep = _nested_all_of({"type": "integer"}, 200)
    assert re.fullmatch(schema_to_regex(deep), "3")
    with pytest.raises(ValueError, match="visits"):  # (SchemaTooComplexError: each round past 16 is a visit)
        schema_to_regex(deep, budget=CompileBudget(max_visits=100))


def test_an_option_cut_off_by_the_recursion_limit_still_excludes_its_sibling():
    """Past `max_ref_depth` the recursive option is left out; its sibling must still not spell what it matches: at
    depth 2 `{"m":1,"n":1}` satisfies both `node` and `{required: [m]}` (it was accepted)."""
    node = {"type": "object", "required": ["n"], "properties": {
        "n": {"type": "integer"}, "c": {"oneOf": [{"$ref": "#/$defs/node"}, {"type": "object", "required": ["m"]}]}}}
    schema = {"$defs": {"node": node}, "$ref": "#/$defs/node"}
    validator = jsonschema.Draft202012Validator(schema)
    proc = JSONSchemaLogitsProcessor(schema, byte_level_tokenizer(), index_cache=IndexCache())
    for depth in range(4):
        text = '{"n":1,"c":' * depth + '{"n":1,"c":{"m":1,"n":1}}' + "}" * depth
        assert not validator.is_valid(json.loads(text))
        assert not accepts(proc, text), text
    assert accepts(proc, '{"n":1,"c":{"n":1,"c":{"m":1}}}')
