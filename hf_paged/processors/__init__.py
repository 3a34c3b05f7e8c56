"""Constrained decoding: JSON Schema, regex and choice logits processors over our own byte automata.

They are stock `transformers.LogitsProcessor`s (usable in `model.generate`) that also implement the
continuous-batching engine's per-request API (`prepare`, `process_rows`, `forced_tokens`, `is_complete`,
`release`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

# Loaded on first use, so that importing a light submodule (the kernels a compiling child process imports,
# `jit`) does not import torch and transformers.
_LAZY = {
    "allocate_token_bitmask": "hf_paged.processors.bitmask",
    "apply_token_bitmask_": "hf_paged.processors.bitmask",
    "CompileBudget": "hf_paged.processors.budget",
    "ChoiceLogitsProcessor": "hf_paged.processors.choice",
    "GrammarLogitsProcessor": "hf_paged.processors.grammar_lark",
    "IndexCache": "hf_paged.processors.index_cache",
    "default_index_cache": "hf_paged.processors.index_cache",
    "JSONSchemaLogitsProcessor": "hf_paged.processors.json_schema",
    "RegexLogitsProcessor": "hf_paged.processors.regex",
    "schema_to_grammar": "hf_paged.processors.schema_ladder",
    "schema_to_regex": "hf_paged.processors.schema_ladder",
    "TokenVocabulary": "hf_paged.processors.vocabulary",
    "build_vocabulary": "hf_paged.processors.vocabulary",
}


def __getattr__(name: str):
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'hf_paged.processors' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.processors.bitmask import allocate_token_bitmask, apply_token_bitmask_
    from hf_paged.processors.budget import CompileBudget
    from hf_paged.processors.choice import ChoiceLogitsProcessor
    from hf_paged.processors.grammar_lark import GrammarLogitsProcessor
    from hf_paged.processors.index_cache import IndexCache, default_index_cache
    from hf_paged.processors.json_schema import JSONSchemaLogitsProcessor
    from hf_paged.processors.regex import RegexLogitsProcessor
    from hf_paged.processors.schema_ladder import schema_to_grammar, schema_to_regex
    from hf_paged.processors.vocabulary import TokenVocabulary, build_vocabulary

__all__ = [
    "ChoiceLogitsProcessor",
    "CompileBudget",
    "GrammarLogitsProcessor",
    "IndexCache",
    "JSONSchemaLogitsProcessor",
    "RegexLogitsProcessor",
    "TokenVocabulary",
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "build_vocabulary",
    "default_index_cache",
    "schema_to_grammar",
    "schema_to_regex",
]
