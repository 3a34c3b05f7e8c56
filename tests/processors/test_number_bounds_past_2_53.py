"""`type: number` bounds that no double equals (integers past 2**53): a text with a fraction parses to a float,
rounded to the nearest double, and `maximum: 2**63 - 1` let `9223372036854775806.5` through, which parses to 2**63,
over the bound (h1's fuzz). Texts with a fraction are now bounded by the double nearest the bound on its inner side;
integer texts parse to exact Python ints and keep the exact bound. What is lost: texts with a fraction between that
double (its 17 digits) and the bound, such as `9223372036854775000.5`, which rounds down to 2**63 - 1024."""

from __future__ import annotations

import json
import math
import re

import pytest

from hf_paged.processors import JSONSchemaLogitsProcessor
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema import schema_to_regex
from tests.processors.toy_tokenizers import accepts, byte_level_tokenizer

jsonschema = pytest.importorskip("jsonschema")


@pytest.mark.parametrize("schema, refused, accepted", [
    ({"type": "number", "maximum": 2**63 - 1}, ["9223372036854775807.0", "9223372036854775806.5", "9223372036854775808"],
     ["9223372036854775807", "9223372036854775806", "9223372036854774699.5", "-3.25"]),
    ({"type": "number", "minimum": 2**53 + 1}, ["9007199254740993.0", "9007199254740992", "9007199254740992.9"],
     ["9007199254740993", "9007199254740994.0", "9007199254740995"]),
    ({"type": "number", "minimum": 2**63 - 1, "maximum": 2**63 - 1}, ["9223372036854775807.0", "9223372036854775806"],
     ["9223372036854775807"]),  # (no double lies within: the integer alone)
])
def test_a_fraction_never_rounds_past_an_integer_bound(schema, refused, accepted):
    validator = jsonschema.Draft202012Validator(schema)
    proc = JSONSchemaLogitsProcessor(schema, byte_level_tokenizer(), index_cache=IndexCache())
    for text in refused:
        assert not validator.is_valid(json.loads(text)) and not accepts(proc, text), text
    for text in accepted:
        assert validator.is_valid(json.loads(text)) and accepts(proc, text), text


def _texts_near(b: int) -> set[str]:
    """Integers and fractions around `b` and around the doubles next to it, both signs."""
    centres = {b}
    f = float(b)
    for direction in (math.inf, -math.inf):
        g = f
        for _ in range(2):
            g = math.nextafter(g, direction)
            centres.add(int(g))
    centres.add(int(f))
    out = set()
    for c in centres:
        for n in range(c - 2, c + 3):
            for text in (str(n), f"{n}.0", f"{n}.5", f"{n}.25", f"{n}.999", f"{n}.0001"):
                out |= {text, "-" + text}
    return out


@pytest.mark.parametrize("base", [2**53 + 1, 2**60, 2**63 - 1, 2**64 - 1, 10**20 + 1, 10**17 + 1])
def test_texts_near_big_bounds_agree_with_jsonschema(base):
    """No text the regex accepts is invalid; beside an integer bound every valid integer text is accepted (exact, as
    before; a float bound's integers go through its 17 digits, as they did)."""
    texts = sorted(_texts_near(base))
    for bound in (base, -base, float(base), -float(base)):
        for keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
            schema = {"type": "number", keyword: bound}
            validator = jsonschema.Draft202012Validator(schema)
            rx = re.compile(schema_to_regex(schema))
            for text in texts:
                valid = validator.is_valid(json.loads(text))
                accepted = rx.fullmatch(text) is not None
                assert valid or not accepted, (schema, text)
                assert accepted or not valid or "." in text or isinstance(bound, float), (schema, text)
