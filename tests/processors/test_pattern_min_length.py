"""`minLength` beside an anchored `pattern` whose repetition is of one character class: the repetition's lower
count is raised (a sound, exact intersection), not refused.

The parser writes `[a-z]+` as a repetition of a one-item group, which the raise did not recognise, so
`{"pattern": "^[a-z]+$", "minLength": 2}` was refused as unsupported (strict) or had its minLength dropped with a
warning (strict=False); only unanchored patterns, whose padding is a bare class, were raised.
"""

from __future__ import annotations

import json
import re

import pytest

from hf_paged.processors.schema import schema_to_regex


@pytest.mark.parametrize("pattern", ["^[a-z]+$", "^(?:[a-z])+$", "^a[a-z]*$", "^x[0-9]*y$"])
@pytest.mark.parametrize(("lo", "hi"), [(3, None), (3, 4), (3, 3)])
def test_min_length_raises_a_one_class_repetition(pattern, lo, hi):
    schema = {"type": "string", "pattern": pattern, "minLength": lo}
    if hi is not None:
        schema["maxLength"] = hi
    regex = re.compile(schema_to_regex(schema))
    samples = {"^[a-z]+$": "abcdefg", "^(?:[a-z])+$": "abcdefg", "^a[a-z]*$": "abcdefg", "^x[0-9]*y$": "x12345y"}
    text = samples[pattern]
    for n in range(1, len(text) + 1):
        candidate = text[: n - 1] + text[-1] if pattern.endswith("y$") else text[:n]
        if re.search(pattern, candidate) is None:
            continue
        expected = n >= lo and (hi is None or n <= hi)
        assert (regex.fullmatch(json.dumps(candidate)) is not None) == expected, (pattern, lo, hi, candidate)
