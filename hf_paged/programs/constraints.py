"""What a field may hold: the constraint values (`text`, `regex`, `schema`, `grammar`, a list of choices), checked
when they are made, and how each becomes regex text (to join with forced literals) or a logits processor.

    hp.text(max_tokens=32)          free text; in a JSON string hole, a JSON string body (never an unescaped quote)
    hp.regex(r"[0-9]{3}")           text matching the regex (Rust `regex` syntax, as `RegexLogitsProcessor`)
    hp.schema({...})                a JSON document valid under the schema
    hp.grammar(lark_text)           a sentence of a Lark grammar
    ["billing", "other"]            exactly one of the choices (scored by `select` item by item)

Each also takes `validator` (text -> bool, checked when the field closes) and `max_retries` (regenerations of that
field alone, from the cached prefix, with a new seed).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from hf_paged.processors.choice import escape_regex
from hf_paged.programs.errors import FieldConstraintError
from hf_paged.programs.hole_regex import group, strip_end_anchors

__all__ = [
    "JSON_BODY_CHAR",
    "Choices",
    "Constraint",
    "GrammarText",
    "Regex",
    "Schema",
    "Text",
    "as_constraint",
    "check_field_options",
    "grammar",
    "regex",
    "schema",
    "text",
]

# One character of a JSON string body: anything but a quote, a backslash or a control character, or an escape.
JSON_BODY_CHAR = r'(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})'


def check_field_options(where: str, max_tokens: Any, validator: Any, max_retries: Any) -> None:
    """Raise `FieldConstraintError` naming `where` for a bad length, validator or retry count."""
    if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
        raise FieldConstraintError(f"{where}: max_tokens must be an int >= 1, got {max_tokens!r}")
    if validator is not None and not callable(validator):
        raise FieldConstraintError(f"{where}: validator must be a callable text -> bool, got "
                                   f"{type(validator).__name__}; pass a function or None")
    if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
        raise FieldConstraintError(f"{where}: max_retries must be an int >= 0, got {max_retries!r}")
    if validator is None and max_retries:
        raise FieldConstraintError(f"{where}: max_retries={max_retries} without a validator retries nothing; pass "
                                   "validator= (a function text -> bool) or drop max_retries")


@dataclass(frozen=True, slots=True)
class _Field:
    max_tokens: int
    validator: Callable[[str], bool] | None
    max_retries: int
    instruction: str | None = None  # fill, item by item: text shown before the record while this field is made


@dataclass(frozen=True, slots=True)
class Text(_Field):
    """Free text of at most `max_tokens` tokens."""


@dataclass(frozen=True, slots=True)
class Regex(_Field):
    pattern: str = ""


@dataclass(frozen=True, slots=True)
class Schema(_Field):
    schema: Any = None


@dataclass(frozen=True, slots=True)
class GrammarText(_Field):
    grammar: str = ""
    start: str = "start"


@dataclass(frozen=True, slots=True)
class Choices(_Field):
    choices: tuple[str, ...] = ()


Constraint = Text | Regex | Schema | GrammarText | Choices


def text(max_tokens: int = 32, *, validator: Callable[[str], bool] | None = None, max_retries: int = 0,
         instruction: str | None = None) -> Text:
    """Free text of at most `max_tokens` tokens (in a JSON string hole: a JSON string body). `instruction` (fill,
    item by item; every constraint takes it): text placed after the prompt, before the record, while this field is
    generated (in a fork: the filled record does not contain it)."""
    check_field_options("hp.text", max_tokens, validator, max_retries)
    return Text(max_tokens, validator, max_retries, _instruction("hp.text", instruction))


def regex(pattern: str, *, max_tokens: int = 64, validator: Callable[[str], bool] | None = None,
          max_retries: int = 0, instruction: str | None = None) -> Regex:
    """Text matching `pattern` in full (Rust `regex` syntax). Raises `InvalidRegexError` when it does not compile."""
    from hf_paged.processors.automaton.build import validate_regex

    if not isinstance(pattern, str) or not pattern:
        raise FieldConstraintError(f"hp.regex: pattern must be a non-empty regex string, got {pattern!r}")
    check_field_options("hp.regex", max_tokens, validator, max_retries)
    validate_regex(pattern)
    return Regex(max_tokens, validator, max_retries, _instruction("hp.regex", instruction), pattern=pattern)


def schema(schema: Any, *, max_tokens: int = 128, validator: Callable[[str], bool] | None = None,
           max_retries: int = 0, instruction: str | None = None) -> Schema:
    """A JSON document valid under `schema` (a dict, JSON text or pydantic class). Raises the schema errors of
    `JSONSchemaLogitsProcessor` (`InvalidSchemaError`, `UnsupportedSchemaError`, ...) when it cannot compile."""
    from hf_paged.processors.schema import load_schema

    check_field_options("hp.schema", max_tokens, validator, max_retries)
    return Schema(max_tokens, validator, max_retries, _instruction("hp.schema", instruction),
                  schema=load_schema(schema))


def grammar(grammar: str, *, start: str = "start", max_tokens: int = 128,
            validator: Callable[[str], bool] | None = None, max_retries: int = 0,
            instruction: str | None = None) -> GrammarText:
    """A sentence of a Lark EBNF grammar. Raises the `GrammarError`s of `GrammarLogitsProcessor`."""
    from hf_paged.processors.lark import compile_lark

    if not isinstance(grammar, str) or not grammar.strip():
        raise FieldConstraintError(f"hp.grammar: grammar must be Lark EBNF text, got {grammar!r}")
    check_field_options("hp.grammar", max_tokens, validator, max_retries)
    compile_lark(grammar, start, None, 1)
    return GrammarText(max_tokens, validator, max_retries, _instruction("hp.grammar", instruction),
                       grammar=grammar, start=start)


def _instruction(where: str, instruction: Any) -> str | None:
    if instruction is not None and (not isinstance(instruction, str) or not instruction.strip()):
        raise FieldConstraintError(f"{where}: instruction must be non-empty text or None, got {instruction!r}")
    return instruction


def choices_of(where: str, values: Any) -> Choices:
    if isinstance(values, str) or not isinstance(values, Sequence):
        raise FieldConstraintError(f"{where}: choices must be a list of strings, got {type(values).__name__}; e.g. "
                                   "['yes', 'no']")
    unique = tuple(dict.fromkeys(values))
    if not unique or any(not isinstance(c, str) or not c for c in unique):
        raise FieldConstraintError(f"{where}: choices must be a non-empty list of non-empty strings, got "
                                   f"{list(values)!r}")
    return Choices(max(len(c.encode("utf-8")) for c in unique), None, 0, choices=unique)  # tokens: at most one per byte


def as_constraint(where: str, value: Any) -> Constraint:
    """A hole's keyword value as a constraint: a list/tuple of strings is a choice, a constraint stays itself."""
    if isinstance(value, Text | Regex | Schema | GrammarText | Choices):
        return value
    if isinstance(value, list | tuple):
        return choices_of(where, value)
    raise FieldConstraintError(
        f"{where}: {type(value).__name__} is not a constraint; give a list of choices, hp.text(max_tokens=...), "
        "hp.regex(...), hp.schema(...) or hp.grammar(...)"
    )


def regex_text(constraint: Constraint, *, json_string: bool, stop_char: str | None,
               max_chars: int | None = None, where: str = "hp.regex") -> str | None:
    """The constraint as regex text to join with forced literals, or None when it has no flat regex (a recursive
    grammar or schema). `json_string`: the hole sits between quotes (a text's value is a JSON string body);
    `stop_char`: the first character of the literal after the hole (free text never contains it); `max_chars`:
    bound a free text's characters (one-shot templates, where tokens cannot be counted per hole); `where`: the
    hole or field, for errors."""
    if isinstance(constraint, Choices):
        values = [_json_body(c) if json_string else c for c in constraint.choices]
        return "(?:" + "|".join(escape_regex(v) for v in values) + ")"
    if isinstance(constraint, Regex):
        body = strip_end_anchors(constraint.pattern)  # the value is matched whole: its ends are the value's
        if json_string:  # the value is a string the pattern matches (Rust syntax), written as a JSON string body
            return "(?:" + _json_string_body(body, constraint.pattern, where) + ")"
        return group(body)
    if isinstance(constraint, Text):
        if json_string:
            char = JSON_BODY_CHAR
        elif stop_char is not None:
            char = "[^" + escape_regex(stop_char) + "]"
        else:
            char = "(?s:.)"
        return char + (f"{{0,{max_chars}}}" if max_chars is not None else "*")
    if isinstance(constraint, Schema):
        from hf_paged.processors.schema import schema_to_grammar

        flat = schema_to_grammar(constraint.schema)
        return "(?:" + flat + ")" if isinstance(flat, str) else None
    from hf_paged.processors.lark import compile_lark

    compiled = compile_lark(constraint.grammar, constraint.start, None, 1).constraint
    return "(?:" + compiled + ")" if isinstance(compiled, str) else None


def _json_string_body(body: str, pattern: str, where: str) -> str:
    """Regex text of the JSON string bodies whose decoded text `body` (the user's `pattern`, Rust syntax, without its
    end anchors) matches in full (`processors.schema.regex_string_body`); errors name the hole and `pattern`."""
    from hf_paged.errors import InvalidRegexError, UnsupportedSchemaError
    from hf_paged.processors.schema import regex_string_body

    try:
        return regex_string_body(body)
    except (InvalidRegexError, UnsupportedSchemaError) as exc:
        raise type(exc)(f"{where}: the regex {pattern!r} sits between quotes, so its value is written as a JSON "
                        f"string body: {exc}") from exc


def _json_body(value: str) -> str:
    import json

    return json.dumps(value, ensure_ascii=False)[1:-1]
