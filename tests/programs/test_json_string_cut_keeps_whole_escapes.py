"""A JSON string body cut short by its token budget loses only a partial escape at its end (an odd run of
backslashes, or a backslash and part of \\uXXXX); an escaped backslash (an even run) is a whole character and stays,
so the closed string decodes to what was generated."""

from __future__ import annotations

import json

import pytest

from hf_paged.programs.steps import _trim_partial_escape


@pytest.mark.parametrize(("body", "kept"), [
    ("ab\\\\", "ab\\\\"),            # an escaped backslash: whole
    ("ab\\\\\\\\", "ab\\\\\\\\"),    # two of them
    ("ab\\", "ab"),                  # a lone backslash: the start of an escape
    ("ab\\\\\\", "ab\\\\"),          # an escaped backslash, then a lone one
    ("ab\\u00", "ab"),               # a cut \\u escape
    ("ab\\\\u00", "ab\\\\u00"),      # an escaped backslash, then plain 'u00'
    ("plain", "plain"),
])
def test_only_a_partial_escape_is_trimmed(body, kept):
    assert _trim_partial_escape(body) == kept
    json.loads('"' + kept + '"')  # the kept body closes as a valid JSON string
