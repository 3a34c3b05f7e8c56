"""Reuse past the last full block (issue 41, point 6): a prompt that shares part of a cached block copies those
tokens' K/V instead of recomputing them; the cache's block is never written."""

from __future__ import annotations

import pytest

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import BlockCopy, KVCacheManager
from hf_paged.cache.radix import RadixCache
from hf_paged.config import PREFIX_EVICTION_POLICIES
from tests.cache.test_radix import cached_request
from tests.tiny_models import ragged_prompts, stock_greedy, tiny_model


def _manager(num_blocks: int = 8, block_size: int = 4) -> tuple[BlockPool, RadixCache, KVCacheManager]:
    pool = BlockPool(num_blocks)
    cache = RadixCache(pool, block_size=block_size)
    return pool, cache, KVCacheManager(pool, block_size, cache)


def test_partial_block_is_the_child_sharing_the_most_next_tokens():
    pool, cache, _ = _manager()
    a = cached_request(pool, cache, [1, 2, 3, 4, 5, 6, 7, 8])
    b = cached_request(pool, cache, [1, 2, 3, 4, 5, 6, 9, 9])
    assert cache.partial_block(a[0], [5, 6, 7, 0]) == (a[1], 3)  # fewer than a block: at most 3 of 4
    assert cache.partial_block(a[0], [5, 6, 9]) == (b[1], 3)
    assert cache.partial_block(a[0], [5, 0]) in ((a[1], 1), (b[1], 1))
    assert cache.partial_block(a[0], [8]) == (-1, 0)
    assert cache.partial_block(None, [1, 2]) == (a[0], 2)  # from the root
    assert cache.partial_block(None, [1, 2], extra_keys=("salt",)) == (-1, 0)  # another tenant's blocks
    assert cache.partial_block(99, [5]) == (-1, 0)  # a block the tree does not hold


def test_a_sequence_copies_the_shared_start_before_writing():
    pool, cache, kv = _manager()
    doc = cached_request(pool, cache, [1, 2, 3, 4, 5, 6, 7, 8])
    assert kv.add_sequence("q", [1, 2, 3, 4, 5, 6, 0, 0, 0]) == 4
    assert kv.take_partial_block("q", [1, 2, 3, 4, 5, 6, 0, 0, 0]) == 2
    assert kv.block_ids("q") == doc and kv.num_tokens("q") == 6
    assert kv.blocks_needed("q", 3) == 2  # the copy of the shared block, then one more
    assert kv.allocate_slots("q", 3)
    table = kv.block_ids("q")
    assert table[0] == doc[0] and table[1] != doc[1]
    assert kv.take_pending_copies() == [BlockCopy(doc[1], table[1])]
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8]).block_ids == doc  # the cache's block is untouched
    pool.check_integrity(kv.expected_ref_counts())
    kv.free("q")
    pool.check_integrity(kv.expected_ref_counts())


def test_the_last_prompt_token_is_always_computed_and_compressed_caches_opt_out():
    pool, cache, kv = _manager()
    cached_request(pool, cache, [1, 2, 3, 4, 5, 6, 7, 8])
    kv.add_sequence("q", [1, 2, 3, 4, 5, 6, 7])
    assert kv.take_partial_block("q", [1, 2, 3, 4, 5, 6, 7]) == 2  # 5 and 6 reused, 7 (the last) computed
    kv.add_sequence("r", [1, 2, 3, 4, 5, 6])
    assert kv.take_partial_block("r", [1, 2, 3, 4, 5, 6]) == 0  # one token: not worth a block copy
    kv.partial_reuse = False
    kv.add_sequence("s", [1, 2, 3, 4, 5, 6, 7])
    assert kv.take_partial_block("s", [1, 2, 3, 4, 5, 6, 7]) == 0


@pytest.mark.parametrize("block_size", [4, 16])
def test_engine_greedy_output_is_unchanged_and_the_partial_tokens_are_hits(block_size):
    model = tiny_model("llama")
    shared = ragged_prompts([37], seed=61)[0]  # not a whole number of blocks
    tails = ragged_prompts([5, 9, 3], seed=62)
    prompts = [shared + t for t in tails]
    expected = stock_greedy(model, prompts, 6)
    engine = Engine(model, PagedConfig(block_size=block_size, num_blocks=64))
    # 42 prompt tokens + 11 of its 12 new ones computed: its third 16-token block is full, so cached
    first = engine.add_request(prompts[0], SamplingParams(max_new_tokens=12))
    outs = [engine.run([first])[first].generated_tokens[:6]]
    for prompt in prompts[1:]:  # one at a time: each finds the first one's blocks cached
        before = engine.stats()["prompt_tokens_cached"]
        rid = engine.add_request(prompt, SamplingParams(max_new_tokens=6))
        while engine.has_unfinished:
            engine.step()
            engine.check_integrity()
        outs.append(engine.pop_output(rid).generated_tokens)
        tail = len(shared) % block_size  # the shared start of one more block, copied when it is worth a copy
        reused = len(shared) if tail >= max(2, block_size // 4) else len(shared) - tail
        assert engine.stats()["prompt_tokens_cached"] - before == reused  # 37 at block 16 (5 copied), 36 at 4
    assert outs == expected
    compressed = Engine(model, PagedConfig(block_size=block_size, num_blocks=64, kv_cache_dtype="int8"))
    assert not compressed.kv.partial_reuse


# -- tails: a finished sequence's last, partial block ---------------------------------------------------------
def test_a_cached_tail_is_found_by_partial_block_only_and_evicts_like_any_leaf():
    pool, cache, kv = _manager()
    events = cache.listen()
    kv.add_sequence("a", [1, 2, 3, 4, 5, 6, 7])
    assert kv.allocate_slots("a", 7)
    kv.cache_full_blocks("a", [1, 2, 3, 4, 5, 6, 7])
    assert kv.cache_tail("a", [1, 2, 3, 4, 5, 6, 7])  # 5 6 7: three tokens of a 4-token block
    tail_block = kv.block_ids("a")[1]
    kv.free("a")
    cache.check_integrity()
    assert cache.num_cached_blocks == 2 and len(cache.cached_digests()) == 1  # routers see full blocks only
    assert [e.kind.name for e in events.since(0).events] == ["STORED"]
    assert cache.match([1, 2, 3, 4, 5, 6, 7, 8]).num_tokens == 4  # never a full-block hit
    kv.add_sequence("b", [1, 2, 3, 4, 5, 6, 7, 9])
    assert kv.take_partial_block("b", [1, 2, 3, 4, 5, 6, 7, 9]) == 3
    assert kv.block_ids("b")[1] == tail_block
    kv.free("b")
    assert sorted(pool.allocate(8)) == list(range(8))  # both cached blocks evictable (the tail, a leaf, first)
    cache.check_integrity()


@pytest.mark.parametrize("policy", PREFIX_EVICTION_POLICIES)  # every policy the config accepts
def test_a_tail_is_evicted_before_any_full_block_even_older_ones(policy):
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=4, policy=policy)
    kv = KVCacheManager(pool, 4, cache)
    old = cached_request(pool, cache, [9, 9, 9, 9])  # a full block cached first: the oldest, used once
    kv.add_sequence("a", [1, 2, 3, 4, 5, 6, 7])
    assert kv.allocate_slots("a", 7)
    kv.cache_full_blocks("a", [1, 2, 3, 4, 5, 6, 7])
    assert kv.cache_tail("a", [1, 2, 3, 4, 5, 6, 7])
    full_block, tail_block = kv.block_ids("a")
    kv.free("a")
    cache.check_integrity()
    assert cache.partial_block(full_block, [5, 6, 7]) == (tail_block, 3)
    assert len(pool.allocate(6)) == 6  # 5 free blocks: one cached block must go
    assert cache.partial_block(full_block, [5, 6, 7]) == (-1, 0)  # the tail went, not the older full block
    assert cache.match([9, 9, 9, 9, 0]).block_ids == old
    cache.check_integrity()


def test_tails_need_their_full_blocks_cached_and_enough_tokens():
    pool, cache, kv = _manager()
    kv.add_sequence("a", [1, 2, 3, 4, 5])
    assert kv.allocate_slots("a", 5)
    assert not kv.cache_tail("a", [1, 2, 3, 4, 5, 6])  # full block not cached yet
    kv.cache_full_blocks("a", [1, 2, 3, 4, 5])
    assert not kv.cache_tail("a", [1, 2, 3, 4, 5])  # one token: not worth a copy
    kv.free("a")
    cache.check_integrity()
    pool.check_integrity(kv.expected_ref_counts())


def test_a_chat_turn_copies_the_previous_answer_s_last_partial_block():
    model = tiny_model("llama")
    first, message = ragged_prompts([21, 6], seed=71)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=64))
    rid = engine.add_request(first, SamplingParams(max_new_tokens=6))
    answer = engine.run([rid])[rid].generated_tokens  # 21 + 5 computed: 3 full blocks and a tail of 2 tokens
    second = first + answer + message
    expected = stock_greedy(model, [second], 5)
    rid = engine.add_request(second, SamplingParams(max_new_tokens=5))
    while engine.has_unfinished:
        engine.step()
        engine.check_integrity()
    out = engine.pop_output(rid)
    assert out.generated_tokens == expected[0]
    assert out.num_cached_tokens == 26  # everything the first turn computed: 24 in blocks + the 2-token tail
