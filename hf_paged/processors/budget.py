"""The work budget of one compile: counts of work, never seconds, so one constraint has one outcome on any machine
under any load.

One `CompileBudget` lives for one schema (all tries of the translation ladder together) or one regex. Each
stage counts what it does, in its own unit; the first limit passed raises `SchemaTooComplexError` naming the
limit and the fix.

    per automaton (each regex, each grammar rule; counted afresh for each, so a memoised one costs the same)
      nfa_states      positions before determinization (counted repetitions unroll: `x{0,500}` is 500 copies)
      dfa_states      states of the byte automaton (each a 256-entry row)
      dfa_steps       subset-construction steps (positions read while building rows)
    per compile (all automata and all tries together)
      schema_objects  objects in the schema document (its meta-schema check costs ~0.3 ms each)
      visits          sub-schemas translated (recursive `$ref`s and `anyOf` distribution multiply them)
      checks          instance checks the translation runs (`enum` values beside other keywords, `oneOf` pairs)
      text            characters of the regex fragments the translation writes, at every level (~1 us each)
      work            the automata's cost (`byte_dfa.automaton_work`, ~1 us units), summed; a memoised automaton
                      is charged again, so the outcome never depends on what another compile left in the memo

The defaults keep every compile under 2 s of CPU on a 2-core 2.4 GHz EPYC (the generated hostile schemas and
regexes of `tests/processors/test_compile_budget.py`), and leave 2-4x headroom over the biggest MaskBench schemas.
"""

from __future__ import annotations

from dataclasses import dataclass

from hf_paged.errors import SchemaTooComplexError

__all__ = ["AUTOMATON_LIMITS", "CompileBudget"]

AUTOMATON_LIMITS = ("nfa_states", "dfa_states", "dfa_steps")
_FIXES = {
    "schema_objects": "split the schema, or move repeated parts to `$defs` and refer to them with `$ref`",
    "visits": "simplify the schema (fewer `anyOf` branches, shallower recursive `$ref`s) or lower max_ref_depth",
    "checks": "shorten long `enum`s that sit beside other keywords, and long `oneOf` lists (or use `anyOf`)",
    "text": "shorten long `enum`s and alternations, and lower counted repetitions",
    "nfa_states": "lower counted repetitions (maxLength, maxItems, {m,n} in patterns) or shorten the pattern",
    "dfa_states": "simplify the pattern (an unbounded part followed by a counted one, e.g. `.*a.{20}`, needs "
                  "exponentially many states), use fewer overlapping alternatives, or anchor `pattern`s",
    "dfa_steps": "use fewer overlapping alternatives and optional members, or simpler patterns",
    "work": "simplify the schema (fewer members, alternatives and counted repetitions)",
}


@dataclass(slots=True)
class CompileBudget:
    """Limits (`max_*`) and counters of one compile; see the module docstring. Pass a budget with higher limits
    (`budget=CompileBudget(max_dfa_states=200_000)`) to compile bigger constraints, more slowly."""

    max_schema_objects: int = 1_000
    max_visits: int = 8_000
    max_checks: int = 20_000
    max_text: int = 10_000_000
    max_nfa_states: int = 150_000
    max_dfa_states: int = 50_000
    max_dfa_steps: int = 4_000_000
    max_work: int = 1_000_000
    schema_objects: int = 0
    visits: int = 0
    checks: int = 0
    text: int = 0
    nfa_states: int = 0
    dfa_states: int = 0
    dfa_steps: int = 0
    work: int = 0

    def spend(self, what: str, amount: int = 1) -> None:
        """Count `amount` units of `what` (a counter's name); raise `SchemaTooComplexError` past its limit."""
        used = getattr(self, what) + amount
        setattr(self, what, used)
        limit = getattr(self, "max_" + what)
        if used > limit:
            raise SchemaTooComplexError(
                f"compiling this constraint needs more than {limit:,} {what.replace('_', ' ')} (`max_{what}` of its "
                f"`CompileBudget`, a count of work, the same on any machine); {_FIXES[what]}, or pass "
                f"`budget=CompileBudget(max_{what}=...)` with a higher limit"
            )

    def left(self, what: str) -> int:
        """Units of `what` still available."""
        return getattr(self, "max_" + what) - getattr(self, what)

    def exhausted(self) -> bool:
        """Whether a per-compile counter is past its limit (no later try of the ladder can succeed)."""
        return (self.visits > self.max_visits or self.checks > self.max_checks or self.text > self.max_text
                or self.work > self.max_work)

    def for_automaton(self) -> CompileBudget:
        """A fresh budget with these limits (its counters at zero): one automaton's own count, or a build that
        repeats what a finished compile already counted."""
        return CompileBudget(self.max_schema_objects, self.max_visits, self.max_checks, self.max_text,
                             self.max_nfa_states, self.max_dfa_states, self.max_dfa_steps, self.max_work)
