"""`RegexLogitsProcessor`: generated text matches a regular expression (Rust `regex` syntax)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hf_paged.errors import InvalidRegexError
from hf_paged.processors.base import GuidedLogitsProcessor
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index import IndexCache

__all__ = ["RegexLogitsProcessor"]


class RegexLogitsProcessor(GuidedLogitsProcessor):
    """Constrain generation to texts that match `pattern` in full; EOS is allowed exactly when they do.

    Args:
        pattern: a regex in Rust `regex` syntax (as Python's `re`, without look-around or back-references). `\\d`,
            `\\w`, `\\s` follow Python's Unicode tables; a pattern with `\\p{..}`, nested classes, `(?i)` or `\\b` is
            compiled whole by outlines-core, bounded only by the size estimate (`IndexCache(max_regex_size=...)`),
            and its `\\d`, `\\w`, `\\s` follow Rust's (`\\w` without `²`, `\\s` without U+001C..U+001F). A start anchor
            there holds only where it leads the pattern.
        tokenizer: the model's tokenizer.
        eos_token_id: the id(s) that end a document; default `tokenizer.eos_token_id`.
        index_cache: where compiled indexes live; default the process-wide cache.
        backend: how masks are applied (see `apply_token_bitmask_`).
        budget: the work limits of the compile (`CompileBudget`: automaton positions, states and steps); counts,
            never seconds, so a pattern compiles or is refused the same way on any machine. Default
            `CompileBudget()`, which keeps every compile under ~2 s of CPU.

    Raises:
        InvalidRegexError: the pattern does not compile. UnsatisfiableSchemaError: it matches nothing.
        SchemaTooComplexError: its automaton is over a limit of `budget` (e.g. `(a|b)*a(a|b){20}` needs 2^21
            states). TokenizerError: no EOS id.

    Example:
        >>> processor = RegexLogitsProcessor(r"[0-9]{3}-[0-9]{4}", tokenizer)                # doctest: +SKIP
        >>> model.generate(**inputs, logits_processor=[processor], max_new_tokens=10)     # doctest: +SKIP
    """

    def __init__(
        self,
        pattern: str,
        tokenizer: Any,
        *,
        eos_token_id: int | Iterable[int] | None = None,
        index_cache: IndexCache | None = None,
        backend: str = "auto",
        budget: CompileBudget | None = None,
    ) -> None:
        if not isinstance(pattern, str) or not pattern:
            raise InvalidRegexError(f"pattern must be a non-empty regex string, got {pattern!r}")
        self.pattern = pattern
        super().__init__(
            pattern,
            tokenizer,
            key_parts=("regex", pattern, None),
            eos_token_id=eos_token_id,
            index_cache=index_cache,
            backend=backend,
            budget=budget,
        )
