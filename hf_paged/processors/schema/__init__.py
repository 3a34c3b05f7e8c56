"""The schema stage: a JSON Schema -> the regex, or the grammar of rules that call each other, that the automaton
stage compiles. Sound first: every text it matches is JSON that validates against the schema.

    load_schema (load)                 text / dict / pydantic class -> a checked schema, nesting counted
    schema_to_regex, schema_to_grammar (ladder)   tries the translation with smaller caps until its automata fit
                                       the work budget (`automaton.check_automaton`)
        translate                      $ref / allOf merges (refs, contains), anyOf / oneOf branches (oneof), type
                                       by type: numbers, strings (pattern), objects (name_rules), arrays, finite values
        reuse                          a node's translation reused within a try (keyed by the $refs it can reach)
        fragments                      the regex text algebra (`Rx`) every type writes in
        context                        one translation's options, budgets and error helpers
        digits                         `NumberDigits`, the bounds on a number's digits (and their default)
    canonical_json (canonical)         an instance written the way the regex spells it (tests, benchmarks)
    regex_string_body (regex_body)     a user's Rust regex as regex text over JSON string bodies (template holes)

Imports the automaton stage (grammar text, the checks), never the token index.
"""

from __future__ import annotations

from hf_paged.processors.schema.canonical import canonical_json
from hf_paged.processors.schema.digits import DEFAULT_DIGITS, NumberDigits
from hf_paged.processors.schema.ladder import schema_to_grammar, schema_to_regex
from hf_paged.processors.schema.load import MAX_SCHEMA_NESTING, check_nesting, check_text_nesting, load_schema
from hf_paged.processors.schema.regex_body import regex_string_body

__all__ = [
    "DEFAULT_DIGITS",
    "MAX_SCHEMA_NESTING",
    "NumberDigits",
    "canonical_json",
    "check_nesting",
    "check_text_nesting",
    "load_schema",
    "regex_string_body",
    "schema_to_grammar",
    "schema_to_regex",
]
