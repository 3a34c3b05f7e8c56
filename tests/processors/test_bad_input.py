"""Bad input raises typed errors at construction."""

from __future__ import annotations

import pytest
from tokenizers import Tokenizer, models
from transformers import PreTrainedTokenizerFast

from hf_paged.errors import (
    InvalidRegexError,
    InvalidSchemaError,
    SchemaError,
    SchemaTooComplexError,
    TokenizerError,
    UnsatisfiableSchemaError,
)
from hf_paged.processors import ChoiceLogitsProcessor, JSONSchemaLogitsProcessor, RegexLogitsProcessor
from tests.processors.toy_tokenizers import byte_level_tokenizer

TOK = byte_level_tokenizer()


def test_invalid_json_text():
    with pytest.raises(InvalidSchemaError, match="not valid JSON"):
        JSONSchemaLogitsProcessor('{"type": "object",', TOK)


def test_not_a_schema():
    with pytest.raises(InvalidSchemaError, match="not a valid JSON Schema"):
        JSONSchemaLogitsProcessor({"type": 5}, TOK)
    with pytest.raises(InvalidSchemaError, match="object or a boolean"):
        JSONSchemaLogitsProcessor([1, 2], TOK)


def test_unsatisfiable_schema():
    with pytest.raises(UnsatisfiableSchemaError):
        JSONSchemaLogitsProcessor({"type": "integer", "minimum": 5, "maximum": 1}, TOK)
    with pytest.raises(UnsatisfiableSchemaError):
        JSONSchemaLogitsProcessor(False, TOK)


def test_pattern_that_does_not_compile():
    with pytest.raises(InvalidRegexError):
        JSONSchemaLogitsProcessor({"type": "string", "pattern": "(["}, TOK)
    with pytest.raises(InvalidRegexError):
        RegexLogitsProcessor("a(", TOK)
    with pytest.raises(InvalidRegexError):
        RegexLogitsProcessor("", TOK)


def test_pattern_too_big():
    with pytest.raises(SchemaTooComplexError):
        RegexLogitsProcessor("a{99999999}", TOK)


def test_tokenizer_without_eos():
    raw = Tokenizer(models.BPE(vocab={"a": 0, "b": 1}, merges=[]))
    with pytest.raises(TokenizerError, match="no EOS"):
        RegexLogitsProcessor("ab", PreTrainedTokenizerFast(tokenizer_object=raw))


def test_bad_choices():
    with pytest.raises(SchemaError, match="non-empty"):
        ChoiceLogitsProcessor([], TOK)
    with pytest.raises(SchemaError, match="list of strings"):
        ChoiceLogitsProcessor("yes", TOK)
    with pytest.raises(SchemaError):
        ChoiceLogitsProcessor(["yes", ""], TOK)


def test_choice_escapes_regex_syntax():
    proc = ChoiceLogitsProcessor(["a.b", "(x)"], TOK)
    assert proc.regex == r"(?:a\.b|\(x\))"
