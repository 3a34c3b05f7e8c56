"""Strings: the JSON string grammar with escapes, `minLength`/`maxLength`, `pattern` and safe `format`s.

Lengths count code points, as `jsonschema` does (`len(str)`), so one counted unit is one code point: a bare
character, a short escape, or a `\\uXXXX` escape that is not half of a surrogate pair (a pair is one code
point but two escapes, so bounded strings leave pairs out and spell astral characters bare).
A `pattern` or `format` is intersected with the length bounds when a sound subset exists (see
`schema.pattern.fit_length`); otherwise the combination is reported as unsupported.
"""

from __future__ import annotations

import warnings
from functools import lru_cache

from hf_paged.errors import UnsupportedSchemaError
from hf_paged.processors.schema.context import Context, pointer_join
from hf_paged.processors.schema.fragments import Rx, raw, rep, seq
from hf_paged.processors.schema.pattern import Node, emit, fit_length, parse_pattern

__all__ = ["ANY_CHAR", "FORMATS", "PLAIN", "STRING", "quoted", "string_regex"]

PLAIN = '[^"\\\\\\x00-\\x1f]'
_SHORT_ESCAPE = '\\\\["\\\\/bfnrt]'
_BMP_ESCAPE = "\\\\u(?:[0-9a-cA-Ce-fE-F][0-9a-fA-F]{3}|[dD][0-7][0-9a-fA-F]{2})"  # no lone surrogate halves
_PAIR_ESCAPE = "\\\\u[dD][89abAB][0-9a-fA-F]{2}\\\\u[dD][c-fC-F][0-9a-fA-F]{2}"
# One code point of an unbounded string: every spelling JSON allows (except lone surrogates).
ANY_CHAR = raw(f"(?:{PLAIN}|{_SHORT_ESCAPE}|{_BMP_ESCAPE}|{_PAIR_ESCAPE})", atomic=True)
# One code point of a counted string: bare characters and the short escapes except \" and \\. Those two (and
# \uXXXX) inside a counted repetition make outlines-core 0.2.14's index build exponential in the count (measured on a 256-byte vocabulary: `{0,12}` 0.2 s, `{0,16}` 3.8 s; without them `{0,256}`
# stays in milliseconds), so bounded strings give them up: a subset of the valid strings, still sound.
_COUNTED_CHAR = Rx(f"(?:{PLAIN}|\\\\[/bfnrt])", 34)
# The same below U+0800 (ASCII and two-byte UTF-8: Latin, Greek, Cyrillic, Hebrew, Arabic...): ~3 automaton
# states per counted character instead of ~9 (each counted position needs its own UTF-8 continuation states).
# Translations that must shrink to fit the budget use it before capping lengths harder or leaving members out.
_NARROW_COUNTED_CHAR = Rx("(?:[\\x20-\\x21\\x23-\\x5b\\x5d-\\x7f\\u0080-\\u07ff]|\\\\[/bfnrt])", 12)
_QUOTE = raw('"', atomic=True)
STRING = Rx(f'"{ANY_CHAR.text}*"', ANY_CHAR.cost + 3)

_HH = "(?:[01][0-9]|2[0-3])"
_MS = "[0-5][0-9]"
_LEAP = "(?:[0-9]{2}(?:0[48]|[2468][048]|[13579][26])|(?:0[48]|[2468][048]|[13579][26])00)"
_YEAR = "(?:[1-9][0-9]{3}|0[1-9][0-9]{2}|00[1-9][0-9]|000[1-9])"  # 0001-9999: validators reading dates as Python's
# `date` (jsonschema's format check) refuse year 0000, which RFC 3339's 4DIGIT would allow
_DATE = (
    f"(?:{_YEAR}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
    f"|02-(?:0[1-9]|1[0-9]|2[0-8]))|{_LEAP}-02-29)"
)
_TIME = f"{_HH}:{_MS}:{_MS}(?:\\.[0-9]{{1,6}})?(?:Z|[+\\-]{_HH}:{_MS})"
_LABEL = "[A-Za-z0-9]{1,20}(?:\\-[A-Za-z0-9]{1,20}){0,2}"  # <= 62 chars, never "--" (no bogus xn-- labels)
_OCTET = "(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_HEX4 = "[0-9a-fA-F]{1,4}"
_URI_CHARS = "[A-Za-z0-9\\-._~!$&'()*+,;=:@]"
_POINTER = "(?:/(?:[^~/\"\\\\\\x00-\\x1f]|~[01])*)*"
_DATE_PART = "(?:[0-9]+Y(?:[0-9]+M)?(?:[0-9]+D)?|[0-9]+M(?:[0-9]+D)?|[0-9]+D)"
_TIME_PART = "(?:[0-9]+H(?:[0-9]+M)?(?:[0-9]+S)?|[0-9]+M(?:[0-9]+S)?|[0-9]+S)"
# scheme://host[:port][/path][?query][#fragment] (RFC 3986 with a registered-name host), or file:///path
_URI_PATH = f"(?:/{_URI_CHARS}*)"
_QUERY_FRAGMENT = f"(?:\\?(?:{_URI_CHARS}|/|\\?)*)?(?:\\#(?:{_URI_CHARS}|/|\\?)*)?"
_URI = (f"(?:[a-z][a-z0-9+.\\-]{{0,15}}://{_LABEL}(?:\\.{_LABEL}){{0,3}}(?::[0-9]{{1,5}})?{_URI_PATH}*"
        f"|file://{_URI_PATH}+){_QUERY_FRAGMENT}")
# A relative reference (RFC 3986 4.2) as `path-absolute` or `path-noscheme` (no ':' in the first segment, so it
# cannot read as a scheme), e.g. `images/icon.png`, `/a/b?q`; network-path (`//host`) and empty ones left out.
_NOSCHEME_CHARS = "[A-Za-z0-9\\-._~!$&'()*+,;=@]"
_RELATIVE_REF = f"(?:/(?:{_URI_CHARS}+{_URI_PATH}*)?|{_NOSCHEME_CHARS}+{_URI_PATH}*){_QUERY_FRAGMENT}"

# Anchored ECMA patterns, each accepting only strings the format's usual validators accept.
FORMATS: dict[str, str] = {
    "date": f"^{_DATE}$",
    "time": f"^{_TIME}$",
    "date-time": f"^{_DATE}T{_TIME}$",
    "email": "^[A-Za-z0-9]+(?:[._+\\-][A-Za-z0-9]+)*@[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*(?:\\.[A-Za-z0-9]+)*\\.[A-Za-z]{2,}$",
    "uuid": "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$",
    "ipv4": f"^{_OCTET}(?:\\.{_OCTET}){{3}}$",
    "ipv6": f"^{_HEX4}(?::{_HEX4}){{7}}$",
    "hostname": f"^{_LABEL}(?:\\.{_LABEL}){{0,3}}$",
    "uri": f"^{_URI}$",
    "uri-reference": f"^(?:{_URI}|{_RELATIVE_REF})$",
    "iri": f"^{_URI}$",
    "iri-reference": f"^(?:{_URI}|{_RELATIVE_REF})$",
    "uri-template": f"^{_URI}$",  # a URI without braces is a valid template
    "idn-email": "^[A-Za-z0-9]+(?:[._+\\-][A-Za-z0-9]+)*@[A-Za-z0-9]+(?:-[A-Za-z0-9]+)*(?:\\.[A-Za-z0-9]+)*\\.[A-Za-z]{2,}$",
    "idn-hostname": f"^{_LABEL}(?:\\.{_LABEL}){{0,3}}$",
    "json-pointer": f"^{_POINTER}$",
    "relative-json-pointer": f"^(?:0|[1-9][0-9]*)(?:#|{_POINTER})$",
    "duration": f"^P(?:{_DATE_PART}(?:T{_TIME_PART})?|T{_TIME_PART}|[0-9]+W)$",
    # regexes made of literal characters only: a small subset, but every one compiles (ECMA-262 and re)
    "regex": "^[A-Za-z0-9 _\\-]*$",
}
# Formats the specification defines that we cannot write a safe regex for: refused, never ignored.
UNSUPPORTED_FORMATS: frozenset[str] = frozenset()


def _parsed(pattern: str, where: str) -> Node:
    """`parse_pattern`, memoised by the pattern alone: `where` only names the place in an error, and a schema repeats
    its patterns (and formats' patterns) at many places. A refused pattern is parsed again, so its error names
    `where`."""
    try:
        return _parsed_pattern(pattern)
    except Exception:  # noqa: BLE001 -- (re-raised by the parse below, naming this place)
        return parse_pattern(pattern, where)


@lru_cache(maxsize=512)
def _parsed_pattern(pattern: str) -> Node:
    return parse_pattern(pattern, "")


def quoted(body: Rx | None) -> Rx | None:
    """A JSON string whose encoded body matches `body`."""
    return seq(_QUOTE, body, _QUOTE)


def string_regex(schema: dict, ctx: Context, pointer: str) -> Rx | None:
    """Regex of the JSON strings allowed by `minLength`, `maxLength`, `pattern` and `format`."""
    min_len = schema.get("minLength", 0)
    max_len = schema.get("maxLength")
    for key, value in (("minLength", min_len), ("maxLength", max_len)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            if isinstance(value, float) and value.is_integer() and value >= 0:
                continue
            raise ctx.invalid(pointer_join(pointer, key), f"`{key}` must be a non-negative integer, got {value!r}",
                              "fix its value")
    min_len = int(min_len)
    max_len = int(max_len) if max_len is not None else None
    if max_len is not None and min_len > max_len:
        return ctx.nothing(pointer, f"minLength {min_len} > maxLength {max_len}")
    node = _constraint_node(schema, ctx, pointer)
    if node is None:
        if min_len == 0 and max_len is None:
            return STRING
        char = _NARROW_COUNTED_CHAR if ctx.narrow_strings else _COUNTED_CHAR
        body = rep(char, min_len, ctx.cap_string(max_len, min_len))
        return ctx.check_cost(quoted(body), pointer)
    fitted = fit_length(node, min_len, max_len, ctx.max_string_repeat)
    if fitted is None:
        key = "maxLength" if max_len is not None else "minLength"
        ctx.unsupported(key, pointer, "its combination with `pattern`/`format` has no regular subset we can build; "
                        "put the length into the pattern (e.g. `^[a-z]{1,20}$`)")
        fitted = (node, ctx.max_string_repeat, False)
    node, cap, open_too = fitted
    return ctx.check_cost(quoted(_emitted(node, cap, open_too)), pointer)


@lru_cache(maxsize=256)
def _emitted(node: Node, cap: int | None, open_too: bool) -> Rx | None:
    """`emit`, memoised: the ladder's tries write the same pattern again and again (a pattern of thousands of
    alternatives costs ~0.2 s to write)."""
    return emit(node, cap, open_too=open_too)


def _constraint_node(schema: dict, ctx: Context, pointer: str) -> Node | None:
    """The parsed `pattern` or known `format` (both at once: the format is enforced, the pattern reported)."""
    pattern = schema.get("pattern")
    fmt = schema.get("format")
    if pattern is not None and not isinstance(pattern, str):
        raise ctx.invalid(pointer_join(pointer, "pattern"), f"`pattern` must be a string, got {pattern!r}",
                          "write the regex as a JSON string")
    fmt_pattern = FORMATS.get(fmt) if isinstance(fmt, str) else None
    if fmt in UNSUPPORTED_FORMATS:
        ctx.unsupported("format", pointer, f"no safe regex for `format: {fmt}`; remove it or use `pattern`")
    if fmt_pattern is not None and pattern is not None:
        ctx.unsupported("pattern", pointer, f"a `pattern` beside `format: {fmt}` cannot be intersected; keep one")
        pattern = None
    source = fmt_pattern or pattern
    if source is None:
        return None  # unknown formats are annotations in draft 2020-12: nothing to enforce
    try:
        return _parsed(source, pointer_join(pointer, "format" if fmt_pattern else "pattern"))
    except UnsupportedSchemaError as exc:
        if ctx.strict:
            raise
        warnings.warn(f"{exc}; dropped because strict=False: output may violate it", UserWarning, stacklevel=5)
        return None
