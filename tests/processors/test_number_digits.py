"""Bounds on a JSON number's digits (`number_digits=`): the default refuses no value a double holds, yet ends
fraction and exponent runs; a bound the user asks for applies wherever the schema leaves a side open, and never
changes what a schema's own `minimum`/`maximum` allow."""

from __future__ import annotations

import itertools
import json
import math
import random
import re
import struct
from decimal import Decimal

import jsonschema
import pytest

from hf_paged.processors import JSONSchemaLogitsProcessor, NumberDigits, schema_to_regex
from hf_paged.processors.schema import DEFAULT_DIGITS
from tests.processors.toy_tokenizers import byte_level_tokenizer


def matches(schema, text: str, **kw) -> bool:
    return re.fullmatch(schema_to_regex(schema, **kw), text) is not None


def random_doubles(n: int, seed: int = 0) -> list[float]:
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        value = struct.unpack("<d", rng.getrandbits(64).to_bytes(8, "little"))[0]
        if math.isfinite(value):
            out.append(value)
    return out + [5e-324, -5e-324, 1.7976931348623157e308, 1e-7 / 3, 0.1 + 0.2, 1e21 / 7, 1.2345678901234567e-7]


def js_fixed(value: float) -> str:
    """JavaScript's `Number.prototype.toString` for 1e-7 <= |x| < 1e21: no exponent, the shortest digits."""
    digits = repr(value)
    return format(Decimal(digits), "f") if 1e-7 <= abs(value) < 1e21 else digits


def test_the_default_refuses_no_double_and_ends_runaway_digits():
    number = {"type": "number"}
    for value in random_doubles(2000):
        for text in (repr(value), js_fixed(value), json.dumps(value)):
            assert matches(number, text), text
    assert not matches(number, "1e" + "9" * 60)  # a 60-digit exponent
    assert not matches(number, "2." + "0" * 24)  # fraction digits until max_new_tokens
    assert matches(number, "2." + "0" * 23) and matches(number, "1.5e-308")
    assert matches(number, "9" * 80)  # integers are exact in JSON: never bounded unless asked
    assert matches({"type": "integer"}, "9" * 80)
    assert DEFAULT_DIGITS == NumberDigits(integer=None, fraction=23, exponent=3)


def test_the_default_leaves_bounded_numbers_and_free_values_but_their_numbers():
    bounded = {"type": "number", "minimum": 0, "maximum": 1}
    assert matches(bounded, "0." + "0" * 300 + "1")  # a schema's own bounds keep their meaning
    assert schema_to_regex(bounded) == schema_to_regex(bounded, number_digits=NumberDigits())
    assert not matches(True, "1e" + "9" * 60)  # an unconstrained value's numbers get the default too
    assert matches(True, '{"a": [1.5e-3, 2]}')


def test_number_digits_off_is_jsons_own_grammar():
    unbounded = NumberDigits()
    assert matches({"type": "number"}, "1e" + "9" * 60, number_digits=unbounded)
    assert matches({"type": "number"}, "2." + "0" * 99, number_digits=unbounded)


CAPS = [NumberDigits(integer=2), NumberDigits(fraction=2), NumberDigits(integer=1, fraction=1, exponent=1),
        NumberDigits(integer=3, fraction=2, exponent=2)]
SCHEMAS = [{"type": "integer"}, {"type": "number"}, {"type": "integer", "minimum": -5},
           {"type": "integer", "maximum": 7}, {"type": "integer", "minimum": 250}, {"type": "number", "minimum": 0.25},
           {"type": "number", "exclusiveMinimum": 0, "maximum": 0.5}, {"type": "number", "maximum": -1.5},
           {"type": "number", "minimum": -2, "maximum": 300}]


def texts():
    """Canonical JSON numbers with up to 4 integer, 3 fraction and 2 exponent digits (a few digit values each)."""
    ints = ["0"] + ["".join(p) for n in range(1, 5) for p in itertools.product("1593", *["095"] * (n - 1))]
    fracs = [""] + ["." + "".join(p) for n in range(1, 4) for p in itertools.product("05", repeat=n)]
    exps = ["", "e1", "e-1", "E+12"]
    for sign, whole, frac, exp in itertools.product(("", "-"), ints, fracs, exps):
        yield sign + whole + frac + exp


def within(schema: dict, caps: NumberDigits, text: str) -> bool:
    """What a capped regex must match: the schema's values, with at most the caps' digits where the schema leaves
    the side of the number's sign open (no exponent once the schema has bounds: `numbers.py`)."""
    value = json.loads(text)
    if not jsonschema.Draft202012Validator(schema).is_valid(value):
        return False
    whole, _, rest = text.lstrip("-").partition(".")
    whole, _, exp = re.split("[eE]", whole, maxsplit=1)[0], None, re.split("[eE]", text, maxsplit=1)[1:]
    frac = re.split("[eE]", rest)[0] if rest else ""
    bounded = any(k in schema for k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"))
    if bounded and exp:
        return False
    if exp and schema["type"] == "integer" or frac and schema["type"] == "integer":
        return False
    open_side = "minimum" not in schema and "exclusiveMinimum" not in schema if text.startswith("-") else \
        "maximum" not in schema and "exclusiveMaximum" not in schema
    if caps.integer is not None and open_side and len(whole) > caps.integer:
        low = schema.get("minimum", schema.get("exclusiveMinimum"))
        if text.startswith("-") or low is None or low < 10**caps.integer:  # (a bound past the cap keeps its meaning)
            return False
    if caps.fraction is not None and len(frac) > caps.fraction:
        return False
    return caps.exponent is None or not exp or len(exp[0].lstrip("+-")) <= caps.exponent


@pytest.mark.parametrize("schema", SCHEMAS)
@pytest.mark.parametrize("caps", CAPS)
def test_user_bounds_match_exactly_the_values_within_them(schema, caps):
    rx = re.compile(schema_to_regex(schema, number_digits=caps))
    wrong = [t for t in texts() if (rx.fullmatch(t) is not None) != within(schema, caps, t)
             and not (t.startswith("-0") and json.loads(t) == 0)]  # ("-0" is not the regexes' spelling of zero)
    assert wrong == []


def test_bad_number_digits_are_refused_with_the_argument_named():
    with pytest.raises(ValueError, match="NumberDigits.integer"):
        NumberDigits(integer=0)
    with pytest.raises(ValueError, match="NumberDigits.fraction"):
        NumberDigits(fraction=True)
    with pytest.raises(TypeError, match="number_digits"):
        JSONSchemaLogitsProcessor({"type": "number"}, byte_level_tokenizer(), number_digits=3)


def test_the_processor_keys_its_index_by_the_bounds():
    tok = byte_level_tokenizer()
    default = JSONSchemaLogitsProcessor({"type": "integer"}, tok)
    capped = JSONSchemaLogitsProcessor({"type": "integer"}, tok, number_digits=NumberDigits(integer=2))
    assert default.index_key != capped.index_key
    index = capped.compiled.index
    state = index.get_initial_state()
    for char in "42":
        state = index.get_next_state(state, tok.convert_tokens_to_ids(char))
    assert index.get_allowed_tokens(state) == [tok.eos_token_id]  # two digits: the number must end
