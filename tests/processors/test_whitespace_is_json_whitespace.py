"""`whitespace=` must match JSON whitespace only (space, tab, LF, CR: RFC 8259); anything else, form feed and
vertical tab included, would let a model write documents that do not parse."""

from __future__ import annotations

import pytest

from hf_paged.processors.json_schema import only_json_whitespace


@pytest.mark.parametrize("pattern", ["[ ]?", "[ \\t\\n\\r]{0,2}", "(?: |\\t)*", "\\n?"])
def test_json_whitespace_is_accepted(pattern):
    assert only_json_whitespace(pattern)


@pytest.mark.parametrize("pattern", ["\\f", "[ \\f]?", "\\x0b", "[\\t-\\r]", "\\s*", ".", "[ ]?a", "\\u00a0"])
def test_anything_else_is_refused(pattern):
    assert not only_json_whitespace(pattern)
