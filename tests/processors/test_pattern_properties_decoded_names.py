"""Whether a `patternProperties` pattern applies to a declared or required name is decided on the decoded name, as
validators decide it: the pattern was matched against the name's JSON spelling, whose escapes (`\\\\`, `\\"`,
`\\u0000`) the pattern's classes do not describe, so `.`, `[^a]`, `\\D`, `^.*$` missed such names and their schema
was skipped (h1's fuzz: 78 of 648 pattern x name pairs, each a false accept where a value broke the pattern's
schema)."""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema.key_names import key_matches, key_readings
from tests.processors.toy_tokenizers import accepts, byte_level_tokenizer

jsonschema = pytest.importorskip("jsonschema")

NAMES = ["", "a", "ab", "abc", "\u00e9", "\U0001f600", "\u0000", "\n", "\r", "\t", '"', "\\", 'a"b', "a\\b", "/", "\u001f",
         "\u007f", "\u0085", "\u2028", "\ufeff", "\u00a0", "A", "1", "\u0663", "12", " ", "a b", "\ud800", "a\u00e9",
         "\\u0041", "e\u0301", "x" * 70, "a\n", "_", "\\\\", '""']
PATTERNS = ["^a", "a$", "^.$", "^..$", ".", "^$", "\\\\", '"', "\\n", "^\\W", "[^a-z]", "\\s", "^\\S$", "u", "0",
            "^.*$", "x{2}", "^[\\x00-\\x1f]", "\\t", "^\\D$", "\u00e9", '^[^"]+$', "^\\w*$", "b", "^[^a]$", "^\\d$",
            "^\\s$", "^(?:a|\\\\)$", "^.{2}$", "[\\\\\"]", "^[\\s\\S]$", "^\\\\u", "(?<q>\")"]

# Where ECMA-262 and Python's `re` read a pattern differently (ASCII `\\w \\d`, ECMA's `\\s` with U+FEFF and without
# U+001C-U+001F and U+0085, `.` refusing U+2028 and CR, `$` not before a final newline): ECMA's verdict.
ECMA_DIFFERS = {
    ("^.$", "\r"): False, ("^.$", "\u2028"): False, (".", "\r"): False, (".", "\u2028"): False,
    ("^.*$", "\r"): False, ("^.*$", "\u2028"): False, ("^.*$", "\n"): False,
    ("^\\S$", "\u001f"): True, ("^\\S$", "\u0085"): True, ("^\\S$", "\ufeff"): False,
    ("\\s", "\u001f"): False, ("\\s", "\u0085"): False, ("\\s", "\ufeff"): True,
    ("^\\s$", "\u001f"): False, ("^\\s$", "\u0085"): False, ("^\\s$", "\ufeff"): True,
    ("^\\W", "\u00e9"): True, ("^\\W", "\u0663"): True, ("^\\D$", "\u0663"): True, ("^\\d$", "\u0663"): False,
    ("^\\w*$", "\u00e9"): False, ("^\\w*$", "a\u00e9"): False, ("^\\w*$", "\u0663"): False,
    ("^$", "\n"): False, ("^\\w*$", "\n"): False,
    **{(p, "a\n"): False for p in ["a$", "^.$", "^.*$", "^\\S$", "^\\D$", "^\\w*$", "^(?:a|\\\\)$", "^[\\s\\S]$"]},
}


def test_each_reading_agrees_with_its_regex_engine_on_every_decoded_name():
    checked = 0
    for pattern in PATTERNS:
        python_pattern = pattern.replace("(?<q>", "(?P<q>")
        for name in NAMES:
            truth = re.search(python_pattern, name) is not None
            readings = key_readings(pattern, name, "#")
            assert readings.python == truth, (pattern, name)
            assert readings.ecma == ECMA_DIFFERS.get((pattern, name), truth), (pattern, name)
            assert key_matches(pattern, name, "#") == (truth or readings.ecma), (pattern, name)
            checked += 1
    assert checked == len(PATTERNS) * len(NAMES)
    assert {(p, n) for p in PATTERNS for n in NAMES} >= set(ECMA_DIFFERS)  # (every listed difference was checked)


ONE_CHAR_INTEGER = {"^.$": {"type": "integer"}}
CASES = [  # (schema, texts that jsonschema refuses, texts it accepts)
    ({"type": "object", "properties": {"\\": {"type": "string"}}, "patternProperties": ONE_CHAR_INTEGER},
     ['{"\\\\":"a"}', '{"\\\\":1}'], ["{}"]),
    ({"type": "object", "properties": {"\\": {"type": "number"}}, "patternProperties": ONE_CHAR_INTEGER},
     ['{"\\\\":1.5}', '{"\\\\":"a"}'], ['{"\\\\":3}', "{}"]),
    ({"type": "object", "properties": {"\u0000": {}}, "patternProperties": ONE_CHAR_INTEGER},
     ['{"\\u0000":"x"}'], ['{"\\u0000":7}']),
    ({"type": "object", "required": ['"'], "patternProperties": ONE_CHAR_INTEGER},
     ['{"\\"":"x"}', "{}"], ['{"\\"":5}']),
    ({"type": "object", "required": ["a\nb"], "patternProperties": {"^[^c]*$": {"maximum": 3}}},
     ['{"a\\nb":4}'], ['{"a\\nb":3}']),
]


@pytest.mark.parametrize("schema, invalid, valid", CASES)
def test_an_escaped_name_gets_every_matching_pattern_schema(schema, invalid, valid):
    validator = jsonschema.Draft202012Validator(schema)
    proc = JSONSchemaLogitsProcessor(schema, byte_level_tokenizer(), index_cache=IndexCache())
    for text in invalid:
        assert not validator.is_valid(json.loads(text)) and not accepts(proc, text), text
    for text in valid:
        assert validator.is_valid(json.loads(text)) and accepts(proc, text), text


def test_where_the_readings_differ_both_sides_bind():
    """`\\W` matches "é" in ECMA-262 (ASCII word characters) and not in Python: the pattern's schema applies (as an
    ECMA validator does), and so does `additionalProperties` (as jsonschema does)."""
    schema = {"type": "object", "required": ["é"], "patternProperties": {"^\\W": {"minimum": 0}},
              "additionalProperties": {"type": "integer", "maximum": 10}}
    proc = JSONSchemaLogitsProcessor(schema, byte_level_tokenizer(), index_cache=IndexCache())
    assert accepts(proc, '{"é":5}')
    assert not accepts(proc, '{"é":11}')  # additionalProperties (the Python reading)
    assert not accepts(proc, '{"é":-1}')  # the pattern's minimum (the ECMA reading)
