"""Strings: escapes, lengths in code points, `pattern` semantics inside the quotes, formats."""

from __future__ import annotations

import itertools
import json
import re

import pytest

from hf_paged.errors import InvalidRegexError, UnsupportedSchemaError
from hf_paged.processors.schema import schema_to_regex


def accepts(schema, text: str) -> bool:
    return re.fullmatch(schema_to_regex(schema), text) is not None


def test_plain_string_accepts_every_json_escape_and_rejects_invalid_json():
    s = {"type": "string"}
    for value in ("", "a b", 'say "hi"', "back\\slash", "tab\there", "\u0001", "é漢😀", "\U0001f600"):
        assert accepts(s, json.dumps(value)), value
        assert accepts(s, json.dumps(value, ensure_ascii=False)), value
    for text in ('"\n"', '"\\x41"', '"a', '"\\"', '"\\ud800"', "'a'"):
        assert not accepts(s, text), text


def test_length_counts_code_points():
    s = {"type": "string", "minLength": 2, "maxLength": 3}
    assert [accepts(s, json.dumps(v, ensure_ascii=False)) for v in ("a", "ab", "abc", "abcd")] == [
        False, True, True, False]
    assert accepts(s, '"😀😀"')  # two astral code points, written bare
    assert not accepts(s, '"\\ud83d\\ude00"')  # one code point in two escapes: never counted as two


def test_max_length_above_the_repeat_cap_is_narrowed_not_dropped():
    rx = schema_to_regex({"type": "string", "maxLength": 1000}, max_string_repeat=8)
    assert re.fullmatch(rx, '"' + "a" * 8 + '"') and not re.fullmatch(rx, '"' + "a" * 9 + '"')


def test_top_level_alternation_stays_inside_the_quotes():
    s = {"type": "string", "pattern": "^a$|^b$"}
    assert accepts(s, '"a"') and accepts(s, '"b"')
    assert not accepts(s, 'a"') and not accepts(s, '"a') and not accepts(s, '"c"')


def test_pattern_is_a_search_unless_anchored():
    s = {"type": "string", "pattern": "[0-9]{2}"}
    assert accepts(s, '"ab12cd"') and not accepts(s, '"a1b2"')
    anchored = {"type": "string", "pattern": "^ab"}
    assert accepts(anchored, '"abzz"') and not accepts(anchored, '"zab"')


def test_pattern_classes_have_ecma_meaning():
    assert not accepts({"type": "string", "pattern": "^\\d+$"}, '"١٢"')  # Arabic-Indic digits are not \d
    assert accepts({"type": "string", "pattern": "^\\w+$"}, '"a_1"')
    assert not accepts({"type": "string", "pattern": "^.$"}, '"\\n"')  # `.` excludes line terminators


def test_negated_classes_exclude_what_python_re_counts_too():
    """`\\D \\S \\W` leave out the Unicode digits / space / word characters Python's `re` (jsonschema's engine)
    counts, so a text we write means the same in both; the table is read off `re` itself: it must agree with
    the `str` tests it stands for on every code point."""
    import re._constants as C

    from hf_paged.processors.schema.pattern import _python_category

    tests = {C.CATEGORY_NOT_DIGIT: str.isdecimal, C.CATEGORY_NOT_SPACE: str.isspace,
             C.CATEGORY_NOT_WORD: lambda ch: ch.isalnum() or ch == "_"}
    for category, test in tests.items():
        ranges = _python_category(category)
        assert all(a[1] + 1 < b[0] for a, b in itertools.pairwise(ranges))  # sorted, disjoint, not adjacent
        inside = {cp for lo, hi in ranges for cp in range(lo, hi + 1)}
        assert inside == {cp for cp in range(0x110000) if test(chr(cp))}
    assert not accepts({"type": "string", "pattern": "^\\W+$"}, '"\u00e9"')  # é is a word character to Python
    assert accepts({"type": "string", "pattern": "^\\S+$"}, '"\u00e9x"')


def test_positive_classes_skip_the_table_and_mean_the_same():
    """`\\d \\w \\s` (no negation around them) are ECMA's few code points that Python's class takes too, found
    without the pass over every code point (`_python_category`, ~80 ms a process): the same ranges as the table's."""
    import re._constants as C

    from hf_paged.processors.schema import pattern

    pattern._python_category.cache_clear()
    positive = {cat: pattern._category(cat) for cat in (C.CATEGORY_DIGIT, C.CATEGORY_WORD, C.CATEGORY_SPACE)}
    assert pattern._python_category.cache_info().currsize == 0
    ecma = {C.CATEGORY_DIGIT: pattern._DIGIT, C.CATEGORY_WORD: pattern._WORD, C.CATEGORY_SPACE: pattern._SPACE}
    for cat, ranges in positive.items():
        assert ranges == pattern._intersect(ecma[cat], pattern._python_category(pattern._POSITIVE[cat]))
    assert (0xFEFF, 0xFEFF) not in positive[C.CATEGORY_SPACE]  # (ECMA's, not Python's)


def test_pattern_intersected_with_length():
    s = {"type": "string", "pattern": "^[a-z]+$", "maxLength": 3}
    assert accepts(s, '"abc"') and not accepts(s, '"abcd"') and not accepts(s, '""')
    m = {"type": "string", "pattern": "^(http|https)://", "minLength": 10}
    assert accepts(m, '"http://abc"') and not accepts(m, '"http://a"')


def test_pattern_errors():
    with pytest.raises(InvalidRegexError, match="does not compile"):
        schema_to_regex({"type": "string", "pattern": "a("})
    with pytest.raises(UnsupportedSchemaError, match="lookahead"):
        schema_to_regex({"type": "string", "pattern": "a(?=b)"})
    with pytest.raises(UnsupportedSchemaError, match="backreferences"):
        schema_to_regex({"type": "string", "pattern": "(a)\\1"})
    with pytest.warns(UserWarning, match="lookahead"):
        assert schema_to_regex({"type": "string", "pattern": "a(?=b)"}, strict=False)


@pytest.mark.parametrize(
    "fmt,good,bad",
    [
        ("date", ["2020-02-29", "1999-12-31", "0001-01-01", "0400-02-29"],
         ["2021-02-29", "2021-13-01", "2021-04-31", "21-01-01", "0000-01-01"]),  # (no year 0: Python's `date`)
        ("time", ["23:59:59Z", "08:30:00.123+02:00"], ["24:00:00Z", "12:00:00", "12:60:00Z"]),
        ("date-time", ["2024-01-15T10:00:00Z"], ["2024-01-15 10:00:00Z", "2024-01-15T10:00:00"]),
        ("email", ["a.b@example.com", "x+y@d-e.org"], ['a"b@example.com', "a@b", "@example.com", "a..b@x.io"]),
        ("uuid", ["123e4567-e89b-12d3-a456-426614174000"], ["123e4567e89b12d3a456426614174000"]),
        ("ipv4", ["192.168.0.1", "0.0.0.0"], ["256.1.1.1", "01.2.3.4", "1.2.3"]),
        ("uri", ["https://example.com/a?b=c", "http://x.io", "http://localhost:8086/x#top", "gs://bucket/a",
                 "file:///tmp/x"], ["example.com", "https://", 'http://a"b', "file://", "http://a b"]),
        ("uri-reference", ["https://example.com/a", "images/icon.png", "/a/b?q=1#f", "../x.json#/defs"],
         ["", "//host/x", "a:b/c", "a b", 'a"b', "images\\icon.png"]),  # relative: path-absolute / noscheme
        ("regex", ["abc", "", "a-b c_1"], ["a(", "x\\d", "[a]"]),  # literal characters only: always compiles
    ],
)
def test_formats_accept_only_valid_json_strings_of_the_format(fmt, good, bad):
    s = {"type": "string", "format": fmt}
    for v in good:
        assert accepts(s, json.dumps(v)), v
    for v in bad:
        assert not accepts(s, json.dumps(v)), v


def test_unknown_format_is_an_annotation():
    assert accepts({"type": "string", "format": "x-custom"}, '"anything"')


def test_format_with_pattern_is_unsupported():
    with pytest.raises(UnsupportedSchemaError, match="pattern"):
        schema_to_regex({"type": "string", "format": "date", "pattern": "^2"})
