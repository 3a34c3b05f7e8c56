"""The automaton stage: regex text -> byte DFA, and grammars of rules that call each other -> a byte automaton over
call stacks, its rows built on demand. Bytes in, states out: nothing here knows tokens (`index/` walks them).

    regex text --syntax.parse--> tree --nfa.build_nfa--> Thompson NFA --dfa.determinize--> DenseDFA
               (or, once the kernels are loaded, --nfa_kernel.regex_nfa--> the same NFA in one compiled loop)
               --byte_dfa.build_byte_dfa (memoised; outlines-core for Rust-only syntax)--> ByteDFA
    Grammar (grammar: root and rules, typed) --grammar_rules--> one ByteDFA per rule, calls cut out
               --grammar_dfa.GrammarDFA--> subset construction over call stacks (grammar_stacks), lazily
    build.build_automaton: a constraint (regex text, or a Grammar) -> ByteDFA | GrammarDFA

outlines-core's `Index` (built over a one-token-per-byte vocabulary) did this before; its build has no size
limit and cannot be interrupted, and some small patterns take it minutes (`x.{20}`: 46 s, doubling per count).
Here a pattern that would explode raises `SchemaTooComplexError` after a bounded amount of work. Syntax that
Python's parser reads differently from Rust's raises `Unsupported` and stays with outlines-core.

Facts of states that the token index reads: how many characters of a JSON string's contents a state takes for sure
(`string_steps`, `grammar_string_steps`), where well-formed UTF-8 characters lead (`utf8`). `refine_classes`
(Moore's refinement for k rounds, `index.state_classes`'s classes) lives here too: imported with the package, so
`jit`'s kernel modules register it.
"""

from __future__ import annotations

from hf_paged.processors.automaton.build import (
    build_automaton,
    check_automaton,
    check_regex_size,
    validate_regex,
)
from hf_paged.processors.automaton.byte_dfa import ByteDFA, anchored, build_byte_dfa, byte_sets, compile_regex
from hf_paged.processors.automaton.dfa import DenseDFA
from hf_paged.processors.automaton.grammar import MAX_RULES, Grammar, call_regex, describe, inline_grammar
from hf_paged.processors.automaton.grammar_dfa import MAX_DEPTH, GrammarDFA
from hf_paged.processors.automaton.grammar_string_steps import GrammarBodySteps
from hf_paged.processors.automaton.refine_kernel import refine_classes
from hf_paged.processors.automaton.regex_size import estimate_regex_size
from hf_paged.processors.automaton.string_steps import UNBOUNDED, BodySteps
from hf_paged.processors.automaton.tree import Unsupported
from hf_paged.processors.automaton.utf8 import multibyte_ends, valid_utf8_suffixes

__all__ = [
    "MAX_DEPTH",
    "MAX_RULES",
    "UNBOUNDED",
    "BodySteps",
    "ByteDFA",
    "DenseDFA",
    "Grammar",
    "GrammarBodySteps",
    "GrammarDFA",
    "Unsupported",
    "anchored",
    "build_automaton",
    "build_byte_dfa",
    "byte_sets",
    "call_regex",
    "check_automaton",
    "check_regex_size",
    "compile_regex",
    "describe",
    "estimate_regex_size",
    "inline_grammar",
    "multibyte_ends",
    "refine_classes",
    "valid_utf8_suffixes",
    "validate_regex",
]
