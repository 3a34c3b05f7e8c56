"""The Lark front end: a grammar in Lark's EBNF -> the `Grammar` the automaton stage runs (`automaton.grammar`),
as the schema stage produces one from a JSON Schema (a sibling of `schema/`, not a part of it).

    Lark text --syntax.parse_lark--> LarkGrammar (rules, terminals, %ignore, %import)
              --recursion--> direct left recursion rewritten as repetition, the rest refused
              --terminals--> terminals as regex text without the call-mark bytes (`common`: common.lark's table)
              --compile.compile_lark--> LarkCompiled: rules in recursion cycles called, the others inlined

Imports the automaton stage (the `Grammar` value and its call marks, character sets), never the token index.
"""

from __future__ import annotations

from hf_paged.processors.lark.compile import LarkCompiled, compile_lark
from hf_paged.processors.lark.syntax import LarkGrammar, parse_lark

__all__ = ["LarkCompiled", "LarkGrammar", "compile_lark", "parse_lark"]
