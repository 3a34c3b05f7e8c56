"""Deep schemas compile or are refused by a nesting budget (SchemaTooComplexError), never a RecursionError."""

import json

import pytest

from hf_paged.errors import SchemaTooComplexError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.json_schema import MAX_SCHEMA_NESTING, check_nesting
from tests.tiny_models import byte_tokenizer


def nested(kind: str, depth: int) -> dict:
    schema: dict = {"type": "integer"}
    for _ in range(depth):
        schema = ({"type": "object", "properties": {"a": schema}, "required": ["a"]} if kind == "object"
                  else {"type": "array", "items": schema, "maxItems": 1})
    return schema


@pytest.fixture(scope="module")
def tokenizer():
    return byte_tokenizer()


@pytest.mark.parametrize("kind", ["object", "array"])
@pytest.mark.parametrize("depth", [10, 31, 40, 63, 500, 2000, 5000])
def test_deep_schemas_compile_or_are_refused_by_the_budget(tokenizer, kind, depth):
    schema = nested(kind, depth)
    levels = depth * (2 if kind == "object" else 1) + 1
    if levels <= MAX_SCHEMA_NESTING:
        JSONSchemaLogitsProcessor(schema, tokenizer)
    else:
        with pytest.raises(SchemaTooComplexError, match=f"deeper than {MAX_SCHEMA_NESTING} JSON levels"):
            JSONSchemaLogitsProcessor(schema, tokenizer)


def test_the_nesting_check_counts_lists_too():
    check_nesting([[[1]]])
    deep: list = []
    for _ in range(MAX_SCHEMA_NESTING + 1):
        deep = [deep]
    with pytest.raises(SchemaTooComplexError):
        check_nesting(deep)


def nested_text(depth: int) -> str:
    """`nested("object", depth)` as JSON text, written without json.dumps (which recurses once per level)."""
    return '{"type": "object", "properties": {"a": ' * depth + '{"type": "integer"}' + '}, "required": ["a"]}' * depth


def test_nested_text_matches_the_dict_form():
    assert json.loads(nested_text(3)) == nested("object", 3)


# Until load_schema turns json.loads' RecursionError (about 1000 levels of JSON text) into SchemaTooComplexError, as
# `hf-paged generate` does in cli.read_schema. Strict: the fix makes these pass, and the marks must go then.
_TEXT_RECURSES = pytest.mark.xfail(raises=RecursionError, strict=True,
                                   reason="processors/json_schema.load_schema lets json.loads' RecursionError escape")


@pytest.mark.parametrize("depth", [40, pytest.param(500, marks=_TEXT_RECURSES),
                                   pytest.param(2000, marks=_TEXT_RECURSES)])
def test_deep_schema_text_is_refused_by_the_budget(tokenizer, depth):
    with pytest.raises(SchemaTooComplexError, match=f"deeper than {MAX_SCHEMA_NESTING} JSON levels"):
        JSONSchemaLogitsProcessor(nested_text(depth), tokenizer)
