"""Our regex compiler: regex text -> byte DFA, with every unit of work counted (`budget.CompileBudget`).

    text --syntax.parse--> tree --nfa.build_nfa--> Thompson NFA --dfa.determinize--> dense byte DFA

outlines-core's `Index` (built over a one-token-per-byte vocabulary) did this before; its build has no size
limit and cannot be interrupted, and some small patterns take it minutes (`x.{20}`: 46 s, doubling per count).
Here a pattern that would explode raises `SchemaTooComplexError` after a bounded amount of work. Syntax that
Python's parser reads differently from Rust's raises `Unsupported` and stays with outlines-core.

`refine_classes` (Moore's refinement for k rounds, `lookahead.py`'s classes) lives here too: imported with the
package, so `jit`'s kernel modules register it.
"""

from __future__ import annotations

from hf_paged.processors.automaton.dfa import DenseDFA, determinize
from hf_paged.processors.automaton.nfa import build_nfa
from hf_paged.processors.automaton.refine_kernel import refine_classes
from hf_paged.processors.automaton.syntax import parse
from hf_paged.processors.automaton.tree import Unsupported
from hf_paged.processors.budget import CompileBudget

__all__ = ["DenseDFA", "Unsupported", "compile_regex", "refine_classes"]


def compile_regex(regex: str, budget: CompileBudget) -> DenseDFA | None:
    """The byte DFA of `regex` matched against whole texts (initial state 0, dead state last), or None when it
    matches no text.

    Raises:
        Unsupported: syntax to leave to outlines-core. InvalidRegexError: look-around and the like.
        SchemaTooComplexError: over one of the budget's limits.
    """
    return determinize(build_nfa(parse(regex), budget), budget)
