"""The "cost" and "slru" eviction policies and the ghost history: exact eviction orders on hand-made trees, bounded
ghosts that give a returning prefix its count back, aging, random traffic, config checks, and greedy outputs equal
to LRU's in the engine."""

from __future__ import annotations

import random

import pytest

from hf_paged import Engine, PagedConfig, RequestStatus, SamplingParams
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.digests import prefix_digests
from hf_paged.cache.eviction_policy import CostPolicy, SLRUPolicy, make_eviction_policy
from hf_paged.cache.ghost_history import GhostHistory
from hf_paged.cache.radix import RadixCache
from hf_paged.errors import PrefixPinLimitError
from tests.cache.test_radix import cached_request
from tests.tiny_models import ragged_prompts, tiny_model


def node(cache: RadixCache, tokens: list[int]):
    return cache._walk(tokens, ()).path[-1]


def test_a_reused_prefix_outlives_newer_once_used_blocks_and_leaves_go_first():
    pool = BlockPool(6)
    cache = RadixCache(pool, block_size=1, policy="cost")
    assert cached_request(pool, cache, [1, 2]) == [0, 1]  # a document
    cache.check_integrity()
    assert cached_request(pool, cache, [3]) == [2]  # one-off prompts, newer
    assert cached_request(pool, cache, [4]) == [3]
    cache.match([1, 2])  # the document is asked about again
    cache.check_integrity()
    # one use decayed over the churn since its insert (2 of 6 blocks -> 4 of 6), plus the hit
    assert node(cache, [1, 2]).reuse == pytest.approx(1 + 0.5 ** ((4 / 6 - 2 / 6) / 8))
    assert node(cache, [1]).value >= node(cache, [1, 2]).value  # a prefix is worth its best extension
    assert pool.allocate(4) == [4, 5, 2, 3]  # free blocks, then the once-used [3], then [4] (older first on ties)
    cache.check_integrity()
    assert cache.inflation == pytest.approx(0.25 * 1.01)  # the floor rose to the evicted value
    assert pool.allocate(2) == [1, 0]  # only the document is left: its leaf, then its first block
    assert cache.num_cached_blocks == 0 and len(cache.ghosts or ()) == 4
    cache.check_integrity()


def test_the_floor_lets_fresh_once_used_blocks_overtake_an_old_popular_one():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=1, policy="cost")
    cached_request(pool, cache, [1])
    cache.match([1])  # used twice: value 1.25 x 1.01
    for token in range(10, 21):  # eleven one-offs; every two evictions raise the floor by 0.25 x 1.01
        cached_request(pool, cache, [token])
        cache.check_integrity()
    assert cache.match([1]).block_ids == []  # aged out: popularity does not live forever
    assert cache.ghosts is not None and prefix_digests([1], 1)[0] in cache.ghosts


def test_a_returning_prefix_resumes_its_decayed_count():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1, policy="cost")
    cached_request(pool, cache, [1, 2])
    taken = pool.allocate(4)  # evicts both blocks of the prefix
    assert taken == [2, 3, 1, 0] and cache.num_cached_blocks == 0
    assert cache.ghosts is not None and len(cache.ghosts) == 2
    pool.free(taken)
    cache.check_integrity()
    table = cached_request(pool, cache, [1, 2])  # comes back: a miss, recomputed, and recognised
    cache.check_integrity()
    # churn clock = blocks newly cached / 4: first insert at 0.25 and 0.5, the return at 0.75 and 1.0
    assert node(cache, [1]).reuse == pytest.approx(1 + 0.5 ** (0.5 / 8))
    assert node(cache, [1, 2]).reuse == pytest.approx(1 + 0.5 ** (0.5 / 8))
    assert (cache.ghosts.num_restored, len(cache.ghosts)) == (2, 0)
    newer = cached_request(pool, cache, [5])  # a once-used prompt, more recent than the prefix
    free = sorted(set(range(4)) - set(table) - set(newer))
    assert pool.allocate(2) == free + newer  # the returned prefix stays; LRU would have evicted its leaf
    assert cache.match([1, 2]).block_ids == table
    cache.check_integrity()


def test_lfu_forgets_a_returning_prefix():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1, policy="lfu")
    cached_request(pool, cache, [1, 2])
    pool.free(pool.allocate(4))
    cached_request(pool, cache, [1, 2])
    assert node(cache, [1, 2]).hit_count == 1 and cache.ghosts is None  # counts restart (the case)


def test_the_ghost_history_is_bounded_and_drops_the_least_recently_evicted():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=1, policy=CostPolicy(ghost_factor=1))
    for token in range(10):
        cached_request(pool, cache, [token])
        cache.check_integrity()
    assert cache.ghosts is not None and cache.ghosts.capacity == 3
    remembered = {t for t in range(10) if prefix_digests([t], 1)[0] in cache.ghosts}
    assert remembered == {4, 5, 6}  # 0..6 evicted, the last three remembered; 7..9 still cached
    cache.reset()
    assert len(cache.ghosts) == 0
    cache.check_integrity()


def test_ghost_history_unit():
    ghosts: GhostHistory[int] = GhostHistory(2)
    ghosts.record(b"a", 1)
    ghosts.record(b"b", 2)
    ghosts.record(b"a", 3)  # refreshed: b is now the oldest
    ghosts.record(b"c", 4)
    assert (ghosts.pop(b"b"), ghosts.pop(b"a"), ghosts.pop(b"a"), len(ghosts)) == (None, 3, None, 1)
    empty: GhostHistory[int] = GhostHistory(0)
    empty.record(b"a", 1)
    assert len(empty) == 0
    with pytest.raises(ValueError, match="capacity"):
        GhostHistory(-1)


def test_lru_and_lfu_keep_no_ghosts_and_no_values():
    for policy in ("lru", "lfu"):
        pool = BlockPool(2)
        cache = RadixCache(pool, block_size=1, policy=policy)
        cached_request(pool, cache, [1, 2])
        cache.match([1, 2])
        pool.free(pool.allocate(2))
        assert cache.ghosts is None and cache.inflation == 0.0
        cache.check_integrity()


def test_cost_policy_arguments_and_config():
    assert make_eviction_policy("cost").name == "cost"
    assert PagedConfig(prefix_eviction_policy="cost").prefix_eviction_policy == "cost"
    with pytest.raises(ValueError, match=r"\['lru', 'lfu', 'cost', 'slru'\], got 'gdsf'"):
        PagedConfig(prefix_eviction_policy="gdsf")
    with pytest.raises(ValueError, match="'cost'"):
        make_eviction_policy("gdsf")
    for bad in ({"attention_cost": -1}, {"half_life": 0}, {"ghost_factor": 1.5}, {"first_use": 0}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            CostPolicy(**bad)
    deep, shallow = CostPolicy().block_cost(40), CostPolicy().block_cost(2)
    assert deep > shallow > 1.0


def test_engine_greedy_output_with_cost_and_slru_equals_lru():
    model = tiny_model("llama")
    docs = ragged_prompts([40, 40], seed=41)
    questions = ragged_prompts([5, 6, 7, 8], seed=42)
    one_offs = ragged_prompts([30, 30, 30], seed=43)
    trace = [docs[0] + questions[0], one_offs[0], docs[1] + questions[1], one_offs[1], docs[0] + questions[2],
             one_offs[2], docs[1] + questions[3]]
    outputs, hits = {}, {}
    for policy in ("lru", "cost", "slru"):
        engine = Engine(model, PagedConfig(block_size=8, num_blocks=16, prefix_eviction_policy=policy))
        outs = []
        for prompt in trace:  # one at a time: the pool holds about two requests
            rid = engine.add_request(prompt, SamplingParams(max_new_tokens=6))
            while engine.has_unfinished:
                engine.step()
                engine.check_integrity()
            outs.append(engine.pop_output(rid).generated_tokens)
        assert engine.stats()["prefix_evictions"] > 0
        assert (engine.stats()["prefix_ghost_blocks"] > 0) == (policy != "lru")  # evicted blocks remembered
        outputs[policy], hits[policy] = outs, engine.stats()["prompt_tokens_cached"]
    assert outputs["cost"] == outputs["lru"] == outputs["slru"]
    assert hits["cost"] >= hits["lru"] and hits["slru"] >= hits["lru"]


# -- pins ------------------------------------------------------------------------------------------------
def test_a_pinned_prefix_is_never_evicted_and_pins_are_bounded():
    pool = BlockPool(6)
    cache = RadixCache(pool, block_size=1)
    doc = cached_request(pool, cache, [1, 2, 3])
    assert cache.pin([1, 2, 3, 9], max_blocks=3) == 3  # the cached full blocks of the prefix
    cache.check_integrity()
    pool.check_integrity(cache.pinned_ref_counts())
    assert pool.allocate(3) == [3, 4, 5] and pool.allocate(1) is None  # the oldest blocks stay: pinned
    cache.insert([7], [3])  # a running request's block
    with pytest.raises(PrefixPinLimitError, match=r"would pin 4 blocks, over the limit of 3 of 6"):
        cache.pin([7], max_blocks=3)
    assert cache.num_pinned_blocks == 3
    assert cache.pin([1, 2], max_blocks=3) == 2  # nested pins share blocks: no new block pinned
    assert cache.pinned_ref_counts() == {doc[0]: 2, doc[1]: 2, doc[2]: 1}
    assert cache.unpin([1, 2, 3]) == 3  # the longest pinned prefix first
    assert cache.unpin([1, 2, 3]) == 2 and cache.unpin([1, 2, 3]) == 0
    cache.check_integrity()
    pool.check_integrity({3: 1, 4: 1, 5: 1})
    pool.free([3, 4, 5])
    assert sorted(pool.allocate(6)) == list(range(6))  # unpinned: evictable again


def test_reset_drops_pins():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=1, policy="cost")
    cached_request(pool, cache, [1, 2])
    cache.pin([1, 2], max_blocks=2)
    cache.reset()
    assert (cache.num_pinned_blocks, pool.num_free_blocks, cache.unpin([1, 2])) == (0, 3, 0)
    cache.check_integrity()
    pool.check_integrity({})


def test_engine_pin_prefix_keeps_a_document_through_a_burst():
    model = tiny_model("llama")
    doc, question = ragged_prompts([40], seed=51)[0], ragged_prompts([5], seed=52)[0]
    one_offs = ragged_prompts([40, 40, 40], seed=53)
    engine = Engine(model, PagedConfig(block_size=8, num_blocks=16))
    params = SamplingParams(max_new_tokens=4)
    engine.run([engine.add_request(doc + question, params)])
    assert engine.pin_prefix(doc) == 40
    assert engine.stats()["prefix_pinned_blocks"] == 5
    for prompt in one_offs:  # each needs 6 of the 11 unpinned blocks: LRU alone would evict the document
        engine.run([engine.add_request(prompt, params)])
        engine.check_integrity()
    before = engine.stats()["prompt_tokens_cached"]
    engine.run([engine.add_request(doc + question, params)])
    assert engine.stats()["prompt_tokens_cached"] - before == 40
    with pytest.raises(PrefixPinLimitError, match="prefix_pin_share"):
        engine.pin_prefix(one_offs[2])  # 5 more blocks: 10 > 8 = 0.5 x 16
    assert engine.unpin_prefix(doc) == 40
    assert engine.stats()["prefix_pinned_blocks"] == 0
    engine.check_integrity()
    assert PagedConfig(prefix_pin_share=0.0).prefix_pin_share == 0.0
    with pytest.raises(ValueError, match="prefix_pin_share"):
        PagedConfig(prefix_pin_share=1.5)


def test_pins_keep_a_block_unpinned_and_a_request_they_block_names_them():
    """A request that fit the pool but not its unpinned part failed with "(16 blocks of 4): raise PagedConfig.
    num_blocks", never naming the pins; `prefix_pin_share=1.0` was taken, so pins could fill the pool (h6 F11, h7 F5)."""
    with pytest.raises(ValueError, match=r"prefix_pin_share must be in \[0, 1\)"):
        PagedConfig(prefix_pin_share=1.0)
    engine = Engine(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=16))
    docs, params = ragged_prompts([16, 16], seed=21), SamplingParams(max_new_tokens=1)
    for doc in docs:
        engine.run([engine.add_request(doc, params)])
        assert engine.pin_prefix(doc) == 16
    assert engine.stats()["prefix_pinned_blocks"] == 8
    prompt = ragged_prompts([36], seed=5)[0]  # 36 + 3 tokens: 10 blocks of the 16, 8 of them pinned
    out = engine.run([rid := engine.add_request(prompt, SamplingParams(max_new_tokens=3))])[rid]
    assert out.status is RequestStatus.FAILED
    assert "(16 blocks of 4, 8 of them held by pinned prefixes): unpin_prefix, lower PagedConfig.prefix_pin_share, " \
           "raise num_blocks or lower max_new_tokens" in out.error
    assert [engine.unpin_prefix(doc) for doc in docs] == [16, 16]
    out = engine.run([rid := engine.add_request(prompt, SamplingParams(max_new_tokens=3))])[rid]
    assert out.status is RequestStatus.FINISHED
    engine.check_integrity()
    small = Engine(tiny_model("llama"), PagedConfig(block_size=4, num_blocks=8))
    small.config.prefix_pin_share = 1.0  # (changed after the config was checked: the pool still keeps a block)
    for doc in docs:
        small.run([small.add_request(doc, params)])
    assert small.pin_prefix(docs[0]) == 16
    with pytest.raises(PrefixPinLimitError, match="over the limit of 7 of 8"):
        small.pin_prefix(docs[1])
    small.check_integrity()


# -- "slru": a reused prefix (and what extends it) protected for a bounded number of pool turnovers --------------
def test_slru_keeps_a_reused_prefix_over_newer_once_used_blocks():
    pool = BlockPool(6)
    cache = RadixCache(pool, block_size=1, policy="slru")
    assert cached_request(pool, cache, [1, 2]) == [0, 1]  # a document
    assert cached_request(pool, cache, [3]) == [2]  # one-off prompts, newer
    assert cached_request(pool, cache, [4]) == [3]
    cache.match([1, 2])  # asked about again: used twice, protected for two turnovers past the current churn (4/6)
    assert node(cache, [1, 2]).value == pytest.approx(4 / 6 + 2.0)
    assert node(cache, [3]).value == pytest.approx(3 / 6)
    cache.check_integrity()
    assert pool.allocate(4) == [4, 5, 2, 3]  # free blocks, then the one-offs (least recent first)
    assert pool.allocate(2) == [1, 0]  # the document last: its leaf, then its first block
    assert len(cache.ghosts or ()) == 4
    cache.check_integrity()


def test_slru_protects_what_extends_a_reused_prefix():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=1, policy="slru")
    first = cached_request(pool, cache, [1, 2, 10])  # system prompt + user A's message
    second = cached_request(pool, cache, [1, 2, 20])  # user B: the system prompt is reused, B's turn extends it
    assert node(cache, [1, 2, 20]).value > node(cache, [1, 2, 10]).value + 0.5  # protected, A's turn is not
    one_off = cached_request(pool, cache, [5])  # the newest block, used once under no reused prefix
    cache.check_integrity()
    assert pool.allocate(5) == [5, 6, 7, first[2], one_off[0]]  # free, then A's once-used turn, then the one-off
    assert cache.match([1, 2, 20]).block_ids == second  # B's whole history stayed
    cache.check_integrity()


def test_slru_ages_a_protected_block_that_is_not_used_again():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=1, policy=SLRUPolicy(protect=1.0))
    cached_request(pool, cache, [1])
    for _ in range(5):
        cache.match([1])  # popular: six uses, the same class as two (no count is read, so nothing to outlive)
    survived = 0
    for token in range(10, 20):  # one-offs: each block newly cached moves the churn clock by 1/3 of a turnover
        cached_request(pool, cache, [token])
        cache.check_integrity()
        survived += bool(cache.peek([1]))
    assert survived == 4  # kept over the one-offs cached within a turnover of its last use, then evicted
    assert not cache.peek([1]) and prefix_digests([1], 1)[0] in (cache.ghosts or ())


def test_slru_a_returning_prefix_is_protected_from_its_remembered_use():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1, policy="slru")
    cached_request(pool, cache, [1, 2])
    pool.free(pool.allocate(4))  # both blocks evicted, their one use remembered
    table = cached_request(pool, cache, [1, 2])  # back: a miss, recomputed, and recognised as a second use
    assert node(cache, [1, 2]).reuse == 2.0 and cache.ghosts is not None and cache.ghosts.num_restored == 2
    newer = cached_request(pool, cache, [5])
    free = sorted(set(range(4)) - set(table) - set(newer))
    assert pool.allocate(2) == free + newer  # the returned prefix stays; LRU would evict its leaf
    cache.check_integrity()


def test_slru_arguments_and_config():
    assert make_eviction_policy("slru").name == "slru"
    assert PagedConfig(prefix_eviction_policy="slru").prefix_eviction_policy == "slru"
    for bad in ({"protect": -1}, {"protect": True}, {"ghost_factor": 1.5}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SLRUPolicy(**bad)


@pytest.mark.parametrize("seed", range(3))
def test_slru_random_traffic_keeps_the_tree_consistent_and_serves_true_prefixes(seed):
    rng = random.Random(seed)
    pool = BlockPool(12)
    cache = RadixCache(pool, block_size=2, policy=SLRUPolicy(protect=0.5, ghost_factor=1))
    heads = [[rng.randrange(4) for _ in range(rng.randrange(2, 7))] for _ in range(4)]  # shared prefixes
    for _ in range(60):
        tokens = rng.choice(heads) + [rng.randrange(4) for _ in range(rng.randrange(0, 6))]
        hit = cache.match(tokens)
        served = [t for b in hit.block_ids for t in cache._node_of_block[b].token_ids]  # what the blocks hold
        assert served == list(tokens[: hit.num_tokens])
        pool.incref(hit.block_ids)
        new = pool.allocate(-(-len(tokens) // 2) - len(hit.block_ids))
        assert new is not None
        cache.insert(tokens, hit.block_ids + new)
        pool.free(reversed(hit.block_ids + new))
        if rng.random() < 0.2:  # another user of the pool takes a few blocks for a while
            taken = pool.allocate(rng.randrange(1, 6))
            assert taken is not None
            pool.free(taken)
        cache.check_integrity()  # values never above a parent's, every idle block queued, ghosts bounded
        assert len(cache.ghosts or ()) <= 12
    assert cache.num_evicted > 0 and cache.ghosts is not None and cache.ghosts.num_restored > 0
