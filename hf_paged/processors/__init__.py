"""Constrained decoding: JSON Schema, regex and choice logits processors built on outlines-core.

They are stock `transformers.LogitsProcessor`s (usable in `model.generate`) that also implement the
continuous-batching engine's per-request API (`prepare`, `process_rows`, `forced_tokens`, `is_complete`,
`release`).
"""

from __future__ import annotations

from hf_paged.processors.bitmask import allocate_token_bitmask, apply_token_bitmask_
from hf_paged.processors.choice import ChoiceLogitsProcessor
from hf_paged.processors.index_cache import IndexCache, default_index_cache
from hf_paged.processors.json_schema import JSONSchemaLogitsProcessor
from hf_paged.processors.regex import RegexLogitsProcessor
from hf_paged.processors.schema_regex import schema_to_grammar, schema_to_regex
from hf_paged.processors.vocabulary import TokenVocabulary, build_vocabulary

__all__ = [
    "ChoiceLogitsProcessor",
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
