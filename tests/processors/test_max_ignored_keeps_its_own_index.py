"""Two Lark processors on one grammar with different `max_ignored` compile different languages: one `IndexCache`
must keep an index for each (the bound is part of the index key), not serve the first's index to the second."""

from __future__ import annotations

import pytest

from hf_paged.processors import GrammarLogitsProcessor
from hf_paged.processors.index.index_cache import IndexCache
from hf_paged.processors.index.vocabulary import bytes_to_unicode
from tests.processors.toy_tokenizers import byte_level_tokenizer

pytest.importorskip("lark")

GRAMMAR = 'start: WORD ("," WORD)*\nWORD: /[a-z]+/\n%ignore " "\n'


def walks(proc: GrammarLogitsProcessor, text: str) -> bool:
    """True when the processor's token index takes `text` byte by byte to a final state."""
    tok, index = byte_level_tokenizer(), proc.compiled.index
    state = index.get_initial_state()
    for byte in text.encode():
        state = index.get_next_state(state, tok.convert_tokens_to_ids(bytes_to_unicode()[byte]))
        if state is None:
            return False
    return index.is_final_state(state)


@pytest.mark.parametrize("order", [(1, None), (None, 1)])
def test_each_max_ignored_gets_its_own_index_in_one_cache(order):
    tok, cache = byte_level_tokenizer(), IndexCache()
    procs = {m: GrammarLogitsProcessor(GRAMMAR, tok, max_ignored=m, index_cache=cache) for m in order}
    assert procs[1].index_key != procs[None].index_key
    assert walks(procs[1], "a , b") and not walks(procs[1], "a ,  b")  # one space at most between tokens
    assert walks(procs[None], "a ,  b") and walks(procs[None], "a   ,   b")  # unbounded
    assert procs[1].compiled is not procs[None].compiled
