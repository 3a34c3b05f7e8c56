"""The automaton of a constraint (a regex, or a `Grammar` of rules that call each other), and the checks
that run before it is built.

Every regex is compiled whole-text, in the anchored form `(?:R)\\z` (`byte_dfa.anchored`). Every unit of work is
counted against a `CompileBudget` (counts, never seconds: one constraint has one outcome on any machine under any
load). outlines-core's `DFA::new` has no size limit and cannot be interrupted (`a{99999999}` exhausts memory,
`x.{20}` takes it 46 s); it only builds the rare patterns in Rust-only syntax, after the size estimate
(`check_regex_size`).
"""

from __future__ import annotations

from hf_paged.errors import SchemaTooComplexError
from hf_paged.processors.automaton.byte_dfa import ByteDFA, anchored, build_byte_dfa
from hf_paged.processors.automaton.grammar import Grammar
from hf_paged.processors.automaton.grammar_dfa import GrammarDFA
from hf_paged.processors.automaton.grammar_rules import grammar_rules
from hf_paged.processors.automaton.regex_size import estimate_regex_size
from hf_paged.processors.budget import CompileBudget

__all__ = ["build_automaton", "check_automaton", "check_regex_size", "validate_regex"]


def build_automaton(regex: str | Grammar, budget: CompileBudget | None = None) -> ByteDFA | GrammarDFA:
    """The byte automaton of a regex, or of a `Grammar` (a `GrammarDFA`: rows built on demand).

    Raises:
        InvalidRegexError, UnsatisfiableSchemaError, SchemaTooComplexError: see `build_byte_dfa`.
    """
    if isinstance(regex, Grammar):
        return GrammarDFA(regex, budget=budget)
    return build_byte_dfa(anchored(regex), budget=budget)


def check_automaton(regex: str | Grammar, budget: CompileBudget | None = None) -> None:
    """Build what `build_automaton` needs that can fail (a regex's byte automaton; a grammar's rules, not its
    rows), memoised for the build, counting its work against `budget`.

    Raises:
        InvalidRegexError, UnsatisfiableSchemaError, SchemaTooComplexError: see `build_byte_dfa`.
    """
    if isinstance(regex, Grammar):
        grammar_rules(regex, budget)
    else:
        build_byte_dfa(anchored(regex), budget=budget)


def check_regex_size(regex: str | Grammar, max_regex_size: int) -> None:
    """Raise `SchemaTooComplexError` when `regex` (or a grammar's biggest rule) unrolls to more than
    `max_regex_size` positions."""
    rules = regex.texts if isinstance(regex, Grammar) else (regex,)
    size = max(map(estimate_regex_size, rules))
    if size > max_regex_size:
        raise SchemaTooComplexError(
            f"the constraint's regex would expand to about {size:,} automaton positions (budget "
            f"{max_regex_size:,}); lower counted repetitions (maxLength, maxItems, integer ranges) or raise "
            "`max_regex_size`"
        )


def validate_regex(regex: str | Grammar, *, max_regex_size: int = 200_000, budget: CompileBudget | None = None) -> None:
    """Check a pattern (or a grammar's rules) before the token index is built: size estimate, syntax, and a non-empty language.

    The byte automaton built here (its work counted against `budget`) is memoised and reused by the build.

    Raises:
        SchemaTooComplexError: the estimated automaton is larger than `max_regex_size`, or its build passes a limit
            of `budget`.
        InvalidRegexError: the pattern does not parse.
        UnsatisfiableSchemaError: the pattern matches nothing.
    """
    check_regex_size(regex, max_regex_size)
    check_automaton(regex, budget)
