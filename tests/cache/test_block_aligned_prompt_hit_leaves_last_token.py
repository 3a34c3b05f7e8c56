"""A prompt whose every full block is cached (its length a multiple of the block size) is served all but its last
token: the last token is always computed, since its logits are needed (`KVCacheManager.add_sequence`)."""

from __future__ import annotations

from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.radix import RadixCache
from tests.cache.test_radix import cached_request


def test_a_fully_cached_block_aligned_prompt_still_computes_its_last_token():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=4)
    kv = KVCacheManager(pool, 4, cache)
    prompt = [1, 2, 3, 4, 5, 6, 7, 8]
    doc = cached_request(pool, cache, prompt)
    assert cache.match(prompt).num_tokens == 8  # both blocks cached
    assert kv.add_sequence("q", prompt) == 4  # the first block only: the second holds the last token
    assert kv.take_partial_block("q", prompt) == 3  # its start is copied, the last token is computed
    assert kv.num_tokens("q") == 7 and kv.block_ids("q") == doc
    kv.check_integrity()
