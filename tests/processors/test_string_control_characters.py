"""JSON forbids raw control characters (U+0000-U+001F) inside strings (RFC 8259 section 7): every string the
translation writes, keys included, must refuse each of them raw (a plain string accepts each escaped).

Only a raw newline was checked before; a class that let U+001F through (`[^"\\\\\\x00-\\x1e]`) passed every test.
"""

from __future__ import annotations

import json
import re

import pytest
import torch

from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import byte_level_tokenizer

CONTROLS = [chr(c) for c in range(0x20)]

SCHEMAS = {
    "string": {"type": "string"},
    "bounded": {"type": "string", "minLength": 1, "maxLength": 4},
    "min only": {"type": "string", "minLength": 2},
    "pattern": {"type": "string", "pattern": "^.*$"},
    "negated class": {"type": "string", "pattern": "^[^a]*$"},
    "undeclared key": {"type": "object", "additionalProperties": {"type": "integer"}},
}


def _doc(name: str, inner: str) -> str:
    if name == "undeclared key":
        return '{"k' + inner + '":1}'
    return '"x' + inner + 'y"'


@pytest.mark.parametrize("name", list(SCHEMAS))
def test_a_raw_control_character_is_refused_and_its_escape_accepted(name):
    regex = re.compile(schema_to_regex(SCHEMAS[name]))
    assert regex.fullmatch(_doc(name, "")), name
    for char in CONTROLS:
        raw = _doc(name, char)
        with pytest.raises(json.JSONDecodeError):
            json.loads(raw)  # (strict JSON refuses it too)
        assert regex.fullmatch(raw) is None, (name, hex(ord(char)))
    if name == "string":  # (counted strings, patterns and free keys leave \uXXXX escapes out: sound subsets)
        for char in CONTROLS:
            escaped = _doc(name, json.dumps(char)[1:-1])
            assert regex.fullmatch(escaped), (name, escaped)


def test_the_mask_inside_a_string_allows_no_raw_control_byte():
    tok = byte_level_tokenizer()
    vocab = tok.get_vocab()
    proc = JSONSchemaLogitsProcessor({"type": "string"}, tok)
    quote = vocab['"']
    scores = proc.process_rows(["r"], [[quote]], torch.zeros(1, len(tok)))
    allowed = set(torch.isfinite(scores[0]).nonzero().flatten().tolist())
    spelled = {token_id: raw for raw, ids in proc.vocab.tokens.items() for token_id in ids}
    assert allowed and all(token_id in spelled for token_id in allowed)
    assert not [token_id for token_id in allowed if any(b < 0x20 for b in spelled[token_id])]
    assert any(spelled[token_id] == b"a" for token_id in allowed)
