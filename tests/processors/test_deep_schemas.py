"""Deep schemas compile or are refused by a nesting budget (SchemaTooComplexError), never a RecursionError."""

import json

import pytest

from hf_paged.errors import SchemaTooComplexError
from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.json_schema import MAX_SCHEMA_NESTING, check_nesting, check_text_nesting, load_schema
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


@pytest.mark.parametrize("depth", [40, 500, 2000])
def test_deep_schema_text_is_refused_by_the_budget(tokenizer, depth):
    with pytest.raises(SchemaTooComplexError, match=f"deeper than {MAX_SCHEMA_NESTING} JSON levels"):
        JSONSchemaLogitsProcessor(nested_text(depth), tokenizer)


def test_deep_schema_text_names_its_depth_and_bytes_are_measured_too(tokenizer):
    text = nested_text(500)
    with pytest.raises(SchemaTooComplexError, match="nests 1001 levels deep as JSON text"):
        load_schema(text)
    for encoding in ("utf-8", "utf-16"):
        with pytest.raises(SchemaTooComplexError, match="1001 levels deep"):
            load_schema(text.encode(encoding))


def test_text_nesting_skips_brackets_inside_strings():
    assert check_text_nesting('{"pattern": "^[{[]+\\"[{]$", "enum": [["{"]]}') == 3
    assert check_text_nesting("true") == 0
    shallow = nested_text(MAX_SCHEMA_NESTING // 2 - 1)  # 63 levels: parsed, then refused by nothing
    assert check_text_nesting(shallow) == MAX_SCHEMA_NESTING - 1
    assert load_schema(shallow) == nested("object", MAX_SCHEMA_NESTING // 2 - 1)
