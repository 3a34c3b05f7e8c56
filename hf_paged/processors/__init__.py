"""Constrained decoding: JSON Schema, regex, choice and Lark grammar logits processors over our own byte automata.

They are stock `transformers.LogitsProcessor`s (usable in `model.generate`) that also implement the
continuous-batching engine's per-request API (`prepare`, `process_rows`, `forced_tokens`, `is_complete`,
`release`). Below them, stages in subpackages, imports running one way (docs/ARCHITECTURE.md):

    schema/     JSON Schema -> regex or grammar        lark/   Lark EBNF -> grammar      (-> automaton)
    automaton/  regex -> byte DFA; grammar -> automaton over call stacks (bytes, never tokens)
    index/      vocabulary trie walked against an automaton -> token masks, memoised (-> automaton)
    (processors: base, json_schema, regex, choice, grammar_lark -> schema, lark, index, automaton)

`budget.py` (work budgets) and `jit.py` (numba kernels compiled off the caller's clock) are leaves every stage uses.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_paged.lazy import lazy_attributes

# Loaded on first use, so that importing a light submodule (the kernels a compiling child process imports,
# `jit`) does not import torch and transformers.
_LAZY = {
    "allocate_token_bitmask": "hf_paged.processors.index",
    "apply_token_bitmask_": "hf_paged.processors.index",
    "CompileBudget": "hf_paged.processors.budget",
    "ChoiceLogitsProcessor": "hf_paged.processors.choice",
    "GrammarLogitsProcessor": "hf_paged.processors.grammar_lark",
    "IndexCache": "hf_paged.processors.index",
    "default_index_cache": "hf_paged.processors.index",
    "JSONSchemaLogitsProcessor": "hf_paged.processors.json_schema",
    "NumberDigits": "hf_paged.processors.schema",
    "RegexLogitsProcessor": "hf_paged.processors.regex",
    "schema_to_grammar": "hf_paged.processors.schema",
    "schema_to_regex": "hf_paged.processors.schema",
    "TokenVocabulary": "hf_paged.processors.index",
    "build_vocabulary": "hf_paged.processors.index",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.processors.budget import CompileBudget
    from hf_paged.processors.choice import ChoiceLogitsProcessor
    from hf_paged.processors.grammar_lark import GrammarLogitsProcessor
    from hf_paged.processors.index import (
        IndexCache,
        TokenVocabulary,
        allocate_token_bitmask,
        apply_token_bitmask_,
        build_vocabulary,
        default_index_cache,
    )
    from hf_paged.processors.json_schema import JSONSchemaLogitsProcessor
    from hf_paged.processors.regex import RegexLogitsProcessor
    from hf_paged.processors.schema import NumberDigits, schema_to_grammar, schema_to_regex

__all__ = [
    "ChoiceLogitsProcessor",
    "CompileBudget",
    "GrammarLogitsProcessor",
    "IndexCache",
    "JSONSchemaLogitsProcessor",
    "NumberDigits",
    "RegexLogitsProcessor",
    "TokenVocabulary",
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "build_vocabulary",
    "default_index_cache",
    "schema_to_grammar",
    "schema_to_regex",
]
