"""`JSONSchemaLogitsProcessor`: generated text is a JSON document valid under a JSON Schema."""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from typing import Any

from hf_paged.compat import regex_parse_tree
from hf_paged.errors import InvalidRegexError, SchemaError, SchemaTooComplexError
from hf_paged.processors.automaton import validate_regex
from hf_paged.processors.base import GuidedLogitsProcessor
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index import IndexCache
from hf_paged.processors.schema import (
    MAX_SCHEMA_NESTING,
    NumberDigits,
    check_nesting,
    check_text_nesting,
    load_schema,
    schema_to_grammar,
)

__all__ = ["MAX_SCHEMA_NESTING", "JSONSchemaLogitsProcessor", "NumberDigits", "check_nesting", "check_text_nesting", "load_schema"]


class JSONSchemaLogitsProcessor(GuidedLogitsProcessor):
    """Constrain generation to JSON documents that validate against `schema`.

    Args:
        schema: a dict (or boolean) schema, its JSON text, or a pydantic model class.
        tokenizer: the model's tokenizer (any HF fast tokenizer).
        whitespace: regex of the whitespace allowed between JSON tokens; None: at most one space (bounded, so a
            model cannot run away in spaces or newlines).
        number_digits: most digits in a number's integer part, fraction and exponent (`NumberDigits(integer=,
            fraction=, exponent=)`, each None for no bound), wherever the schema's own `minimum`/`maximum` leave a
            side open: opt in to stop a model writing integers until `max_new_tokens` (integers longer than the bound
            are then refused). None (default): at most 23 fraction and 3 exponent digits in numbers without bounds,
            which refuses no value a double holds (every one has a shorter text), and nothing else.
        strict: raise `UnsupportedSchemaError` for keywords that cannot be enforced exactly; False: warn and use a
            looser constraint that still only allows valid JSON.
        undeclared_keys: objects that declare `properties` but have no `additionalProperties` keyword may also
            get undeclared keys, after the declared ones, as JSON Schema allows (default: every valid document
            can be produced); False: their declared keys only, like xgrammar's and OpenAI's strict modes (every
            output is still valid, and a model cannot wander into invented fields). A schema that wants no
            extras says so with `"additionalProperties": false`, which both settings follow.
        eos_token_id: the id(s) that end a document; default `tokenizer.eos_token_id`.
        index_cache: where compiled indexes live; default the process-wide cache.
        backend: how masks are applied (see `apply_token_bitmask_`).
        budget: the work limits of the compile (`CompileBudget`: sub-schemas visited, automaton states and steps,
            ...); counts, never seconds, so a schema compiles or is refused the same way on any machine. Default
            `CompileBudget()`, which keeps every compile under ~2 s of CPU.

    Raises:
        InvalidSchemaError, UnsupportedSchemaError, UnsatisfiableSchemaError, InvalidRegexError,
        SchemaTooComplexError, TokenizerError (from `hf_paged.errors`), at construction.

    Example:
        >>> processor = JSONSchemaLogitsProcessor({"type": "object", "properties": {"n": {"type": "integer"}},
        ...                                        "required": ["n"]}, tokenizer)          # doctest: +SKIP
        >>> out = model.generate(**inputs, logits_processor=[processor], max_new_tokens=20)  # doctest: +SKIP
        >>> json.loads(tokenizer.decode(out[0, inputs["input_ids"].shape[1]:], skip_special_tokens=True))
        {'n': 42}
    """

    def __init__(
        self,
        schema: Any,
        tokenizer: Any,
        *,
        whitespace: str | None = None,
        number_digits: NumberDigits | None = None,
        strict: bool = True,
        undeclared_keys: bool = True,
        eos_token_id: int | Iterable[int] | None = None,
        index_cache: IndexCache | None = None,
        backend: str = "auto",
        budget: CompileBudget | None = None,
    ) -> None:
        if whitespace is not None and not isinstance(whitespace, str):
            raise TypeError(f"whitespace must be a regex string or None, got {type(whitespace).__name__}")
        if whitespace is not None:
            try:
                validate_regex(whitespace)
            except SchemaError as exc:
                raise InvalidRegexError(f"whitespace={whitespace!r} does not compile as a regex ({exc}); give "
                                        "e.g. '[ ]?' or '[ \\n]{0,4}'") from None
            if not only_json_whitespace(whitespace):  # else documents that do not parse, ending "stop"
                raise InvalidRegexError(f"whitespace={whitespace!r} can match text that is no JSON whitespace; give a "
                                        "regex over space, \\t, \\n and \\r only, e.g. '[ ]?' or '[ \\n]{0,4}'")
        budget = budget if budget is not None else CompileBudget()
        self.schema = load_schema(schema, budget)
        self.whitespace = whitespace
        self.number_digits = number_digits
        self.strict = strict
        # a regex, or for a schema whose flat regex is over budget a `Grammar` of rules (`grammar_dfa`)
        try:
            regex = schema_to_grammar(self.schema, whitespace=whitespace, number_digits=number_digits, strict=strict,
                                      undeclared_keys=undeclared_keys, budget=budget)
        except RecursionError:  # a safety net under MAX_SCHEMA_NESTING ($ref chains, unusual shapes)
            raise SchemaTooComplexError(
                "the schema is too deeply nested to compile; flatten it (e.g. move repeated parts to $defs and "
                "refer to them with $ref)"
            ) from None
        # property order matters to the regex (keys are generated in schema order): never sort keys here
        canonical = json.dumps(self.schema, ensure_ascii=False, separators=(",", ":"))
        if not canonical.isascii() and re.search("[\ud800-\udfff]", canonical):  # (lone surrogates: no UTF-8)
            canonical = json.dumps(self.schema, separators=(",", ":"))
        super().__init__(
            regex,
            tokenizer,
            key_parts=("json_schema", canonical, whitespace, strict, undeclared_keys,
                       *(() if number_digits is None else (list(_digits_key(number_digits)),))),
            eos_token_id=eos_token_id,
            index_cache=index_cache,
            backend=backend,
            budget=budget.for_automaton(),  # (the ladder already counted the automata it built; these rebuild them)
            translated=True,
        )


def _digits_key(digits: NumberDigits) -> tuple:
    return ("digits", digits.integer, digits.fraction, digits.exponent)


_JSON_SPACE = frozenset((9, 10, 13, 32))  # the only whitespace JSON allows between tokens (RFC 8259)


def only_json_whitespace(pattern: str) -> bool:
    """Whether every text `pattern` matches is JSON whitespace: literals and classes of space, tab, LF and CR under
    groups, alternations and repeats (read with Python's regex parser; `\\s`, `.`, anchors and anything it cannot
    read count as more)."""
    try:
        return _spaces_only(regex_parse_tree(pattern))
    except (re.error, RecursionError, OverflowError):
        return False


def _spaces_only(items) -> bool:
    for op, arg in items:
        name = str(op)
        if name == "LITERAL":
            ok = arg in _JSON_SPACE
        elif name == "IN":
            ok = all(str(o) == "LITERAL" and a in _JSON_SPACE
                     or str(o) == "RANGE" and all(c in _JSON_SPACE for c in range(a[0], a[1] + 1)) for o, a in arg)
        elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
            ok = _spaces_only(arg[2])
        elif name == "SUBPATTERN":
            ok = _spaces_only(arg[-1])
        elif name == "BRANCH":
            ok = all(_spaces_only(branch) for branch in arg[1])
        else:
            ok = False
        if not ok:
            return False
    return True
