"""The token index stage: a vocabulary's tokens walked against a byte automaton (`automaton/`) into token masks,
memoised per state and per compiled constraint.

    TokenVocabulary (vocabulary) --shared_trie.token_trie--> TokenTrie (token_trie; JSON-string plans laid out)
    ByteDFA | GrammarDFA + TokenTrie --TokenIndex (token_index)--> a state's mask on its first visit:
        TrieWalk (token_walk, the compiled loop in walk_kernel), shortcuts for JSON-string contents
        (string_tokens, string_masks, closed_states), grammar states inside rules (grammar_masks, state_classes,
        past_stops)
    IndexCache (index_cache): compiled indexes by key, LRU bounded in measured bytes (byte_lru, sizes), on disk
        (index_files), built in the background
    bitmask: the int32 bitmask rows the processors apply to logits

Loaded on first use (like `hf_paged.processors`), so that importing a kernel module (`walk_kernel`,
`closed_states`: `jit`'s compiling child) does not import torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hf_paged.lazy import lazy_attributes

_LAZY = {
    "allocate_token_bitmask": "hf_paged.processors.index.bitmask",
    "apply_token_bitmask_": "hf_paged.processors.index.bitmask",
    "num_bitmask_words": "hf_paged.processors.index.bitmask",
    "CompiledIndex": "hf_paged.processors.index.index_cache",
    "IndexCache": "hf_paged.processors.index.index_cache",
    "default_index_cache": "hf_paged.processors.index.index_cache",
    "index_key": "hf_paged.processors.index.index_cache",
    "StateMask": "hf_paged.processors.index.token_index",
    "TokenIndex": "hf_paged.processors.index.token_index",
    "TokenVocabulary": "hf_paged.processors.index.vocabulary",
    "build_vocabulary": "hf_paged.processors.index.vocabulary",
}


__getattr__ = lazy_attributes(__name__, _LAZY)


if TYPE_CHECKING:  # pragma: no cover
    from hf_paged.processors.index.bitmask import (
        allocate_token_bitmask,
        apply_token_bitmask_,
        num_bitmask_words,
    )
    from hf_paged.processors.index.index_cache import CompiledIndex, IndexCache, default_index_cache, index_key
    from hf_paged.processors.index.token_index import StateMask, TokenIndex
    from hf_paged.processors.index.vocabulary import TokenVocabulary, build_vocabulary

__all__ = [
    "CompiledIndex",
    "IndexCache",
    "StateMask",
    "TokenIndex",
    "TokenVocabulary",
    "allocate_token_bitmask",
    "apply_token_bitmask_",
    "build_vocabulary",
    "default_index_cache",
    "index_key",
    "num_bitmask_words",
]
