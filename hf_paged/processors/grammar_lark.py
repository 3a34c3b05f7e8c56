"""`GrammarLogitsProcessor`: generated text is a sentence of a context-free grammar written in Lark's EBNF.

    Lark text --lark.syntax--> LarkGrammar --lark.compile--> Grammar (rules that call each other,
    `automaton.grammar`) --IndexCache--> the grammar automaton JSON schemas use (`automaton.grammar_dfa`)
    -> token masks

What of Lark is read, and how:
- rules (`?`/`!` modifiers, `.n` priorities, `-> alias` accepted and ignored: they shape Lark's trees, not the
  language), terminals, literals with escapes and `i`, `/regex/` with flags `imsux`, `"a".."z"`, `| ? * + () []`,
  `~ n`, `~ n..m`, `%ignore`, `%import common.X [-> Y]` / `%import common (X, Y)` (our own table of Lark's
  `common` terminals), any `start=` rule.
- The language is the grammar's, with terminals as sets of strings and `%ignore` text as any number of matches
  (`max_ignored=None`): what Lark's Earley parser with `lexer="dynamic_complete"` accepts, but for two places where
  its lexer keeps to Python's preferred match. It reads a regex terminal as the match `re` prefers and that match's
  prefixes (`A: /a|ab/` never reads `ab`; lazy quantifiers, read here as greedy ones, match their shortest), and an
  `%ignore` pattern by its longest match only (with `%ignore WS`, `"a" " " "b"` refuses `"a\t b"`: the ignored run
  takes the space the literal needs). Both times Lark refuses a sentence that we accept, never the reverse. Lark's
  standard and contextual lexers (LALR) tokenize greedily and refuse more (e.g. `"ab"` for `start: A "b"` with
  `A: /a+b?/`).
- Direct left recursion is rewritten as repetition; other left recursion is refused (`LeftRecursionError`).
- Refused with a typed error (`GrammarError` subclasses): templates, `%declare`, `%override`, `%extend`, imports
  of other modules, look-around, anchors, back-references in terminals, recursive terminals, and literals holding
  the control characters 0x02 / 0x0E..0x1F (reserved: they mark rule calls); classes and `.` never match those.
- Calls nest at most `grammar_dfa.MAX_DEPTH` (128) deep: deeper nesting is never offered (sound, not complete).
- An ambiguous grammar's automaton state holds one call stack per way to parse the text so far; a state that
  would hold more than `grammar_dfa.MAX_CONFIGURATIONS` (1,024) raises `SchemaTooComplexError` when decoding
  reaches it (`a: "x" a? a?` after about a dozen `x`: its parses grow like Fibonacci).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from hf_paged.processors.base import GuidedLogitsProcessor
from hf_paged.processors.budget import CompileBudget
from hf_paged.processors.index import IndexCache
from hf_paged.processors.lark import LarkCompiled, compile_lark

__all__ = ["GrammarLogitsProcessor"]


class GrammarLogitsProcessor(GuidedLogitsProcessor):
    """Constrain generation to the sentences of a context-free grammar in Lark's EBNF; EOS is allowed exactly when
    the text so far is a whole sentence.

    Args:
        grammar: the grammar text (Lark EBNF; see the module docstring for what is supported).
        tokenizer: the model's tokenizer.
        start: the rule documents derive from (Lark's `start=`).
        eos_token_id: the id(s) that end a document; default `tokenizer.eos_token_id`.
        index_cache: where compiled indexes live; default the process-wide cache (a grammar compiled twice, for
            the same vocabulary, is built once).
        backend: how masks are applied (see `apply_token_bitmask_`).
        budget: the work limits of the compile (`CompileBudget`: text written, automaton states and steps);
            counts, never seconds, so a grammar compiles or is refused the same way on any machine.
        max_ignored: the most matches of the `%ignore` patterns before, between and after two tokens (default 1:
            with `%ignore " "`, one space, so a small model cannot emit spaces until `max_new_tokens`); None: any
            number, Lark's own meaning. A pattern of whitespace runs (`WS`: `/[ \t\f\r\n]+/`) counts each character (or
            `\r\n`) as a match: `%ignore WS` allows one space, tab or newline between tokens by default.

    Raises:
        GrammarSyntaxError, UndefinedRuleError, LeftRecursionError, UnsupportedGrammarError (all `GrammarError`,
        a `SchemaError`); UnsatisfiableSchemaError: a rule derives no finite text; SchemaTooComplexError: over
        `budget`; TokenizerError: no EOS id. All at construction.

    Example:
        >>> grammar = '''
        ... start: expr
        ... expr: expr "+" term | term
        ... term: NUMBER | "(" expr ")"
        ... %import common.NUMBER
        ... '''
        >>> processor = GrammarLogitsProcessor(grammar, tokenizer)                          # doctest: +SKIP
        >>> model.generate(**inputs, logits_processor=[processor], max_new_tokens=20)     # doctest: +SKIP
    """

    def __init__(
        self,
        grammar: str,
        tokenizer: Any,
        *,
        start: str = "start",
        eos_token_id: int | Iterable[int] | None = None,
        index_cache: IndexCache | None = None,
        backend: str = "auto",
        budget: CompileBudget | None = None,
        max_ignored: int | None = 1,
    ) -> None:
        if not isinstance(start, str) or not start:
            raise TypeError(f"start must be a rule name (str), got {start!r}")
        if max_ignored is not None and (isinstance(max_ignored, bool) or not isinstance(max_ignored, int)
                                        or max_ignored < 0):
            raise ValueError(f"max_ignored must be None or an int >= 0, got {max_ignored!r}")
        budget = budget if budget is not None else CompileBudget()
        self.grammar = grammar
        self.start = start
        self.max_ignored = max_ignored
        self.compiled_grammar: LarkCompiled = compile_lark(grammar, start, budget, max_ignored)
        super().__init__(
            self.compiled_grammar.constraint,
            tokenizer,
            key_parts=("lark", grammar, start, max_ignored),
            eos_token_id=eos_token_id,
            index_cache=index_cache,
            backend=backend,
            budget=budget.for_automaton(),  # (the front end counted its text; the automata count afresh)
        )
