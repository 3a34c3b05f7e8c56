"""Deep schemas compile or are refused by a nesting budget (SchemaTooComplexError), never a RecursionError."""

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
@pytest.mark.parametrize("depth", [10, 31, 40, 63, 500, 5000])
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
