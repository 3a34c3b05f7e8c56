"""`ChoiceLogitsProcessor`: generated text is exactly one of a list of strings."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from hf_paged.errors import SchemaError
from hf_paged.processors.base import GuidedLogitsProcessor
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index import IndexCache

__all__ = ["ChoiceLogitsProcessor", "escape_regex"]

_META = frozenset("\\.+*?()|[]{}^$#&-~")  # what Rust `regex` treats as syntax (and allows to escape)


def escape_regex(text: str) -> str:
    """`text` as a Rust-regex literal (Python's `re.escape` escapes characters Rust rejects)."""
    return "".join("\\" + c if c in _META else c for c in text)


class ChoiceLogitsProcessor(GuidedLogitsProcessor):
    """Constrain generation to exactly one of `choices` (then EOS).

    Args:
        choices: the allowed texts (non-empty strings; duplicates are ignored).
        tokenizer: the model's tokenizer.
        eos_token_id: the id(s) that end a document; default `tokenizer.eos_token_id`.
        index_cache: where compiled indexes live; default the process-wide cache.
        backend: how masks are applied (see `apply_token_bitmask_`).
        budget: the work limits of the compile (`CompileBudget`); counts, the same on any machine.

    Raises:
        SchemaError: `choices` is empty or holds something other than non-empty strings.
        SchemaTooComplexError: the choices' automaton is over one of `budget`'s limits.

    Example:
        >>> processor = ChoiceLogitsProcessor(["positive", "negative", "neutral"], tokenizer)  # doctest: +SKIP
    """

    def __init__(
        self,
        choices: Sequence[str],
        tokenizer: Any,
        *,
        eos_token_id: int | Iterable[int] | None = None,
        index_cache: IndexCache | None = None,
        backend: str = "auto",
        budget: CompileBudget | None = None,
    ) -> None:
        if isinstance(choices, str) or not isinstance(choices, Iterable):
            raise SchemaError(f"choices must be a list of strings, got {type(choices).__name__}; e.g. ['yes', 'no']")
        unique = list(dict.fromkeys(choices))
        if not unique or any(not isinstance(c, str) or not c for c in unique):
            raise SchemaError(f"choices must be a non-empty list of non-empty strings, got {list(choices)!r}")
        self.choices = unique
        pattern = "(?:" + "|".join(escape_regex(c) for c in unique) + ")"
        super().__init__(
            pattern,
            tokenizer,
            key_parts=("choice", pattern, None),
            eos_token_id=eos_token_id,
            index_cache=index_cache,
            backend=backend,
            budget=budget,
        )
