"""Reading a schema before it is translated: JSON text, a dict or a pydantic model class -> a checked JSON Schema.

Nesting is measured before anything recurses over the schema (a scan of the text's brackets, a walk without
recursion), so a deep schema is refused by a count, the same on any machine, instead of ending in a RecursionError;
then it is checked against its meta-schema: by jsonschema-rs (compiled: ~20 us where jsonschema takes ~10 ms) when
that says valid and every regex the check would test compiles, else by jsonschema, whose verdict and error message
are the reference.
"""

from __future__ import annotations

import json
import re
from typing import Any

from hf_paged.errors import InvalidRegexError, InvalidSchemaError, SchemaTooComplexError, UnsupportedSchemaError
from hf_paged.processors.budget import CompileBudget

__all__ = ["MAX_SCHEMA_NESTING", "check_nesting", "check_text_nesting", "load_schema"]


def load_schema(schema: Any, budget: CompileBudget | None = None) -> dict | bool:
    """Accept a schema as a dict/bool, JSON text, or a pydantic model class; check it against its meta-schema.

    Raises:
        InvalidSchemaError: not JSON, not a schema, or an object of another type.
        InvalidRegexError: a `pattern` (or other regex keyword) that does not compile.
        SchemaTooComplexError: nested deeper than `MAX_SCHEMA_NESTING`, or more objects than the budget's
            `max_schema_objects` (counted before the meta-schema check, whose cost grows with them).
    """
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):  # pydantic v2 model class
        schema = schema.model_json_schema()
    elif isinstance(schema, (str, bytes, bytearray)):
        if not isinstance(schema, str):  # (json.loads' own reading of bytes: UTF-8, -16 or -32 by their first bytes)
            schema = bytes(schema).decode(json.detect_encoding(schema), "surrogatepass")
        check_text_nesting(schema)  # before json.loads, which recurses once per level (RecursionError near 1000)
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as exc:
            raise InvalidSchemaError(
                f"the schema is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno}); pass a dict "
                "or valid JSON text"
            ) from None
    if not isinstance(schema, (dict, bool)):
        raise InvalidSchemaError(
            f"a JSON Schema is an object or a boolean, got {type(schema).__name__}; pass a dict, JSON text or a "
            "pydantic model class"
        )
    (budget if budget is not None else CompileBudget()).spend("schema_objects", check_nesting(schema))
    if _meta_valid_fast(schema):
        return schema
    from jsonschema import Draft202012Validator, exceptions, validators

    try:
        validators.validator_for(schema, default=Draft202012Validator).check_schema(schema)
    except RecursionError:  # jsonschema recurses a few frames per level: a safety net under MAX_SCHEMA_NESTING
        raise SchemaTooComplexError(
            "the schema is too deeply nested to check; flatten it (e.g. move repeated parts to $defs and refer to "
            "them with $ref)"
        ) from None
    except exceptions.SchemaError as exc:
        where = "/".join(str(p) for p in exc.absolute_path) or "(root)"
        if exc.validator == "format" and exc.validator_value == "regex":
            if re.search(r"\\[pP]\{", str(exc.instance)):  # valid ECMA-262 (`u` flag) that Python's `re` rejects
                raise UnsupportedSchemaError(
                    f"the pattern {exc.instance!r} at #/{where} uses \\p{{..}} (a Unicode property class), which we "
                    "cannot translate; rewrite it with explicit character ranges"
                ) from None
            raise InvalidRegexError(
                f"the regex {exc.instance!r} at #/{where} does not compile; fix the pattern"
            ) from None
        raise InvalidSchemaError(
            f"this is not a valid JSON Schema: {exc.message} at #/{where}; fix that keyword"
        ) from None
    return schema


def _meta_valid_fast(schema: dict | bool) -> bool:
    """True when the schema is surely valid against its meta-schema (jsonschema's `check_schema` would pass): the
    compiled check passes and every `pattern` / `patternProperties` regex compiles (jsonschema tests their `regex`
    format; jsonschema-rs does not). False means "not known here": the caller asks jsonschema, for the verdict and
    the message. The regexes are looked for everywhere, data included: a false alarm only costs the slow path."""
    try:
        import jsonschema_rs
    except ImportError:  # (an optional speed-up: jsonschema alone gives the same verdicts)
        return False
    try:
        if not jsonschema_rs.meta.is_valid(schema):
            return False
    except Exception:  # noqa: BLE001 -- e.g. a `$schema` it does not know: jsonschema decides
        return False
    stack: list = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            patterns = node.get("patternProperties")
            keys = patterns if isinstance(patterns, dict) else ()
            if not (_regex_compiles(node.get("pattern")) and all(map(_regex_compiles, keys))):
                return False
            stack.extend(v for v in node.values() if isinstance(v, (dict, list)))
        elif isinstance(node, list):
            stack.extend(v for v in node if isinstance(v, (dict, list)))
    return True


def _regex_compiles(pattern: Any) -> bool:
    """What jsonschema's `regex` format check accepts (Python's `re`); anything but a string is not a regex here."""
    if not isinstance(pattern, str):
        return True
    try:
        re.compile(pattern)
    except (re.error, RecursionError, OverflowError):
        return False
    return True


# Most nested JSON levels of a schema document we compile (a level of `properties` is two: the keyword's object and
# the sub-schema). Counted before anything recurses over the schema, so a deep one is refused by this budget, the
# same on any machine, instead of ending in a RecursionError; real schemas stay far below it.
MAX_SCHEMA_NESTING = 64


# A JSON string (escapes included) or one bracket: what the text's nesting is measured on.
_STRING_OR_BRACKET = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"|[\[\]{}]', re.DOTALL)


def _too_deep(levels: int | None, where: str) -> SchemaTooComplexError:
    depth = f" {levels} levels deep{where}," if levels is not None else ""
    return SchemaTooComplexError(
        f"the schema nests{depth} deeper than {MAX_SCHEMA_NESTING} JSON levels (MAX_SCHEMA_NESTING); flatten it "
        "(e.g. move repeated parts to $defs and refer to them with $ref)"
    )


def check_text_nesting(text: str) -> int:
    """Raise `SchemaTooComplexError` for JSON text nested deeper than `MAX_SCHEMA_NESTING` (measured by a scan of its
    brackets outside strings, without parsing or recursion); return its deepest level. Malformed text is left to
    the parser, which reports it."""
    depth = deepest = 0
    for match in _STRING_OR_BRACKET.finditer(text):
        char = match.group()
        if char == "{" or char == "[":
            depth += 1
            deepest = max(deepest, depth)
        elif char == "}" or char == "]":
            depth -= 1
    if deepest > MAX_SCHEMA_NESTING:
        raise _too_deep(deepest, " as JSON text")
    return deepest


def check_nesting(schema: Any) -> int:
    """Raise `SchemaTooComplexError` for a schema nested deeper than `MAX_SCHEMA_NESTING` (walked without
    recursion); return how many objects it holds."""
    stack = [(schema, 1)]
    num_objects = 0
    while stack:
        node, depth = stack.pop()
        num_objects += isinstance(node, dict)
        if depth > MAX_SCHEMA_NESTING:
            raise _too_deep(None, "")
        children = node.values() if isinstance(node, dict) else node if isinstance(node, list) else ()
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return num_objects
