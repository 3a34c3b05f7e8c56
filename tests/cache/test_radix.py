"""RadixCache: exact-id unit tests and a hypothesis state machine of requests sharing prefixes."""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from hf_paged.cache import radix
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.digests import block_digest, prefix_digests
from hf_paged.cache.eviction_policy import make_eviction_policy
from hf_paged.cache.radix import InsertResult, PrefixMatch, RadixCache


def cached_request(pool: BlockPool, cache: RadixCache, tokens: list[int], extra_keys: tuple = ()) -> list[int]:
    """Run a request to completion: reuse its cached prefix, allocate the rest, insert, free. Returns its table."""
    hit = cache.match(tokens, extra_keys)
    pool.incref(hit.block_ids)
    new = pool.allocate(-(-len(tokens) // cache.block_size) - len(hit.block_ids))
    assert new is not None
    table = hit.block_ids + new
    cache.insert(tokens, table, extra_keys)
    pool.free(reversed(table))
    return table


# -- digests -------------------------------------------------------------------------------------------
def test_block_digest_is_a_fixed_function_of_its_inputs():
    # A golden value: the digest must not depend on the process (no salted hash()), the platform or the version.
    first = block_digest(None, [1, 2, 3, 4])
    assert first.hex() == block_digest(None, (1, 2, 3, 4)).hex() == "9dafe1470f3c76621a682584996b7035"
    assert block_digest(first, [5, 6], ("adapter", 3)).hex() == "fb97484447fd90af94397fd6a6913233"
    assert prefix_digests([1, 2, 3, 4, 5], 2) == [
        block_digest(None, [1, 2]),
        block_digest(block_digest(None, [1, 2]), [3, 4]),
    ]


def test_block_digest_separates_everything_the_kv_depends_on():
    root = block_digest(None, [7, 8])
    digests = [
        root,
        block_digest(None, [8, 7]),
        block_digest(root, [7, 8]),
        block_digest(None, [7, 8], ("a",)),
        block_digest(None, [7, 8], ("a", "bc")),
        block_digest(None, [7, 8], ("ab", "c")),
        block_digest(None, [7, 8], (1,)),
        block_digest(None, [7, 8], (True,)),
        block_digest(None, [7, 8], ("1",)),
        block_digest(None, [7, 8], (b"1",)),
        block_digest(None, [7, 8], (None,)),
        block_digest(None, [7, 8], ((1, 2),)),
        block_digest(None, [7, 8], (1, 2)),
        block_digest(None, [7, 8, 0]),
    ]
    assert len(set(digests)) == len(digests) and all(len(d) == 16 for d in digests)
    with pytest.raises(TypeError, match="cannot be hashed stably across processes"):
        block_digest(None, [1], (object(),))


# -- match and insert ----------------------------------------------------------------------------------
def test_match_returns_the_longest_prefix_of_full_blocks_by_exact_id():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=2)
    assert cache.match([1, 2, 3]) == PrefixMatch(block_ids=[], num_tokens=0)
    assert cached_request(pool, cache, [1, 2, 3, 4, 5]) == [0, 1, 2]
    assert cache.num_cached_blocks == 2  # the trailing partial block is not cached
    assert cache.match([1, 2, 3, 4, 5, 6]) == PrefixMatch([0, 1], 4)
    assert cache.match([1, 2, 3, 9]) == PrefixMatch([0], 2)
    assert cache.match([1, 2, 3]) == PrefixMatch([0], 2)
    assert cache.match([9, 2, 3, 4]) == PrefixMatch([], 0)
    assert (cache.num_queries, cache.num_hits, cache.num_query_tokens, cache.num_hit_tokens) == (6, 3, 25, 8)
    # the second request reuses blocks 0 and 1 and computes only its own tail
    assert cached_request(pool, cache, [1, 2, 3, 4, 7, 7]) == [0, 1, 3]  # 2 went to the back of the free queue
    assert cache.match([1, 2, 3, 4, 7, 7]) == PrefixMatch([0, 1, 3], 6)
    cache.check_integrity()
    pool.check_integrity({})


def test_extra_keys_separate_prefixes():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=2)
    cached_request(pool, cache, [1, 2, 3, 4], ("adapter-a",))
    assert cache.match([1, 2, 3, 4], ("adapter-a",)).block_ids == [0, 1]
    assert cache.match([1, 2, 3, 4], ("adapter-b",)).block_ids == []
    assert cache.match([1, 2, 3, 4]).block_ids == []
    assert cached_request(pool, cache, [1, 2, 3, 4]) == [2, 3]
    cache.check_integrity()


def test_is_inflight_looks_at_the_first_block_past_the_cached_prefix():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=2)
    cached_request(pool, cache, [1, 2])
    running_prompt = [1, 2, 3, 4, 5, 6]  # in prefill: its blocks [3 4] and [5 6] are not cached yet
    inflight = set(cache.digests(running_prompt))
    assert cache.digests(running_prompt) == prefix_digests(running_prompt, 2) and len(inflight) == 3
    queries_before = cache.num_queries
    assert cache.is_inflight([1, 2, 3, 4, 9], (), inflight)  # [3 4] is next and being computed: wait
    assert not cache.is_inflight([1, 2, 7, 7], (), inflight)  # [7 7] is nobody's
    assert not cache.is_inflight([1, 2, 3], (), inflight)  # no full block past the cached prefix
    assert not cache.is_inflight([1, 2, 3, 4], ("other-adapter",), inflight)
    assert not cache.is_inflight([1, 2, 3, 4], (), set())
    assert cache.num_queries == queries_before


def test_insert_is_idempotent_and_reports_duplicates():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=2)
    first, second = pool.allocate(3), pool.allocate(3)  # two requests computed the same prefix at once
    assert cache.insert([1, 2, 3, 4], first[:2]) == InsertResult(2, [0, 1], [])
    assert cache.insert([1, 2, 3, 4, 5, 6], first) == InsertResult(1, [0, 1, 2], [])  # running, then finished
    assert cache.insert([1, 2, 3, 4, 9, 9, 0], second) == InsertResult(1, [0, 1, 5], [3, 4])
    assert (pool.is_cached(3), pool.is_cached(4), pool.is_cached(5)) == (False, False, True)
    pool.free(reversed(first))
    pool.free(reversed(second))  # duplicates 3 and 4 were private: they are free now
    assert pool.num_idle_cached_blocks == 4 and pool.num_cached_blocks == 4
    assert cache.match([1, 2, 3, 4, 9, 9]).block_ids == [0, 1, 5]
    cache.check_integrity()
    pool.check_integrity({})


def test_insert_ignores_partial_blocks_and_extra_ids():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=4)
    ids = pool.allocate(2)
    assert cache.insert([1, 2, 3, 4, 5], ids) == InsertResult(1, [0], [])
    assert cache.insert([1, 2, 3, 4, 5, 6, 7, 8], ids[:1]) == InsertResult(0, [0], [])
    cache.check_integrity()


def test_insert_misuse_raises_and_leaves_the_tree_valid():
    pool = BlockPool(6)
    cache = RadixCache(pool, block_size=2)
    ids = pool.allocate(2)
    pool.free([ids[1]])
    with pytest.raises(ValueError, match="block 1 is not in use"):
        cache.insert([1, 2, 3, 4], ids)
    assert cache.num_cached_blocks == 1  # the valid first block stays cached
    with pytest.raises(ValueError, match="block 0 is already cached for another prefix"):
        cache.insert([5, 6], [0])
    with pytest.raises(ValueError, match="block id 9 is out of range"):
        cache.insert([5, 6], [9])
    cache.check_integrity()
    pool.check_integrity({0: 1})


def test_a_digest_collision_is_never_served(monkeypatch):
    # Force every block under the same parent to collide: the tokens must still decide.
    monkeypatch.setattr(radix, "chained_digest", lambda parent, tokens, extra: (parent or b"") + b"x")
    pool = BlockPool(6)
    cache = RadixCache(pool, block_size=2)
    cached_request(pool, cache, [1, 2, 3, 4])
    assert cache.match([1, 2, 3, 5]).block_ids == [0]
    assert cache.match([9, 9, 3, 4]).block_ids == []
    ids = pool.allocate(2)
    assert cache.insert([9, 9, 3, 4], ids) == InsertResult(0, [], [])  # the resident entry stays
    assert not pool.is_cached(ids[0])
    cache.check_integrity()


def test_constructor_checks():
    pool = BlockPool(2)
    with pytest.raises(ValueError, match="unknown prefix eviction policy 'fifo'"):
        RadixCache(pool, 2, policy="fifo")
    with pytest.raises(ValueError, match="block_size must be a positive int"):
        RadixCache(pool, 0)
    cache = RadixCache(pool, 1)
    assert pool.evictor is cache
    cached_request(pool, cache, [1])
    with pytest.raises(ValueError, match="already has 1 cached blocks"):
        RadixCache(pool, 1)


# -- eviction ------------------------------------------------------------------------------------------
def test_lru_evicts_least_recently_used_leaves_first_and_parents_after_children():
    pool = BlockPool(5)
    cache = RadixCache(pool, block_size=1)
    assert cached_request(pool, cache, [1, 2, 3]) == [0, 1, 2]
    assert cached_request(pool, cache, [1, 2, 4]) == [0, 1, 3]
    cache.match([1, 2, 3])  # refresh the first branch
    assert pool.allocate(2) == [4, 3]  # the free block, then the stale leaf [1 2 4]
    assert pool.allocate(1) == [2]  # leaf [1 2 3]
    assert pool.allocate(1) == [1]  # its parent became a leaf
    assert (pool.num_evictions, cache.num_evicted, cache.match([1, 2, 3]).block_ids) == (3, 3, [0])
    cache.check_integrity()


def test_lfu_keeps_the_most_served_prefix():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=1, policy="lfu")
    cached_request(pool, cache, [1])
    cached_request(pool, cache, [2])
    cached_request(pool, cache, [3])
    for _ in range(2):
        cache.match([1])
    cache.match([3])
    assert pool.allocate(2) == [1, 2]  # [2] never served, then [3] (served once); LRU would have kept [3] and [1]
    assert cache.match([1]).block_ids == [0]


def test_priority_policy_keeps_high_priority_prefixes():
    pool = BlockPool(3)
    cache = RadixCache(pool, block_size=1, policy="priority")
    ids = pool.allocate(1)
    cache.insert([1], ids, priority=5)
    pool.free(ids)
    cached_request(pool, cache, [2])
    cached_request(pool, cache, [3])
    assert pool.allocate(2) == [1, 2]
    assert cache.match([1]).block_ids == [0]
    assert make_eviction_policy("priority").name == "priority"


def test_a_custom_policy_that_orders_parents_first_still_evicts_leaves_only():
    class ShallowFirst:
        name = "shallow-first"

        def sort_key(self, node):
            return (node.depth,)

    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1, policy=ShallowFirst())
    cached_request(pool, cache, [1, 2, 3])
    assert pool.allocate(4) == [3, 2, 1, 0]  # the free block, then leaf by leaf up the path
    assert cache.num_cached_blocks == 0
    cache.check_integrity()
    with pytest.raises(TypeError, match="sort_key"):
        RadixCache(BlockPool(1), 1, policy=object())


def test_blocks_in_use_are_never_evicted_and_compete_again_once_idle():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1)
    held = pool.allocate(2)
    cache.insert([1, 2], held)  # oldest entries, but a request holds them
    cached_request(pool, cache, [5])
    assert pool.allocate(1) == [3]
    assert pool.allocate(1) == [2]  # the idle [5]; [1 2] are parked, not evicted
    assert pool.allocate(1) is None
    pool.free(reversed(held))
    assert pool.allocate(2) == [1, 0]  # idle now: leaf first
    assert cache.num_cached_blocks == 0
    cache.check_integrity()
    pool.check_integrity({0: 1, 1: 1, 2: 1, 3: 1})


def test_idle_node_under_an_in_use_child_is_dropped_with_its_subtree_only_when_needed():
    # Breaks the engine's invariant on purpose (a request released the middle of its prefix).
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1)
    table = pool.allocate(3)
    cache.insert([1, 2, 3], table)
    pool.free([table[0], table[1]])  # ancestors idle, leaf block 2 still held
    cached_request(pool, cache, [9])  # block 3: an idle leaf, newer
    assert pool.allocate(1) == [3]  # the idle leaf goes first, although newer
    # Then the deepest idle node with an in-use child goes with its subtree: [1 2] (block 1) comes back, block 2
    # keeps working but is no longer cached, and [1] (block 0) stays cached, now an idle leaf.
    assert pool.allocate(1) == [1]
    assert (pool.is_cached(2), pool.ref_counts[2], cache.num_cached_blocks) == (False, 1, 1)
    assert cache.match([1, 2, 3]).block_ids == [0]
    pool.free([2])
    assert pool.allocate(2) == [2, 0]  # block 2 went to the free queue when released; then [1] is evicted
    pool.check_integrity({0: 1, 1: 1, 2: 1, 3: 1})
    cache.check_integrity()


def test_a_duplicate_insert_under_an_idle_prefix_is_evicted_safely_and_recached():
    # Two requests computed [1 2] at once; the later one (B) hangs its own third block under A's cached blocks.
    # When A finishes, those are idle while B's child is in use: the engine invariant "an in-use block's
    # ancestors are in use" does not hold, and eviction must still neither strand nor take a block in use.
    pool = BlockPool(5)
    cache = RadixCache(pool, block_size=1)
    a, b = pool.allocate(2), pool.allocate(3)
    assert (a, b) == ([0, 1], [2, 3, 4])
    cache.insert([1, 2], a)
    assert cache.insert([1, 2, 3], b) == InsertResult(1, [0, 1, 4], [2, 3])
    pool.free(reversed(a))
    assert pool.allocate(1) == [1]  # [1 2] (block 1) goes with its subtree; B's block 4 is uncached, still in use
    assert (pool.is_cached(4), pool.ref_counts[4], cache.match([1, 2, 3]).block_ids) == (False, 1, [0])
    assert cache.insert([1, 2, 3], b) == InsertResult(2, [0, 3, 4], [2])  # B finishes: its blocks are cached now
    pool.free(reversed(b))
    assert cache.match([1, 2, 3]).block_ids == [0, 3, 4]
    cache.check_integrity()
    pool.check_integrity({1: 1})


def test_reset_forgets_everything_and_frees_idle_blocks():
    pool = BlockPool(4)
    cache = RadixCache(pool, block_size=1)
    cached_request(pool, cache, [1, 2])
    running = pool.allocate(1)
    cache.insert([7], running)
    assert cache.reset() == 3
    assert (cache.num_cached_blocks, pool.num_cached_blocks, pool.num_free_blocks) == (0, 0, 3)
    assert cache.match([1, 2]).block_ids == [] and cache.match([7]).block_ids == []
    assert cache.insert([7], running, epoch=0) == InsertResult(0, [], [])  # computed under the old weights
    assert cache.insert([7], running, epoch=cache.epoch) == InsertResult(1, [2], [])
    assert cache.reset() == 1 and cache.epoch == 2
    pool.free(running)
    assert pool.allocate(4) == [3, 0, 1, 2]  # nothing was evicted: all were plain free blocks
    assert pool.num_evictions == 0
    cache.check_integrity()


def test_the_eviction_heap_stays_bounded_under_repeated_hits():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=1)
    cached_request(pool, cache, [1, 2, 3, 4])
    for _ in range(500):
        cache.match([1, 2, 3, 4])
    assert len(cache._queue) <= 2 * 4 + 64 + 4
    cache.check_integrity()


# -- properties ----------------------------------------------------------------------------------------
BLOCK_SIZE = 2
prompts = st.lists(st.integers(0, 1), min_size=1, max_size=7)  # a 2-token alphabet: prefixes collide often
extras = st.sampled_from([(), ("lora-a",)])


class SpyEvictor:
    """Sits between the pool and the cache: checks every victim is idle and was cached."""

    def __init__(self, machine: RadixMachine) -> None:
        self.machine = machine

    def evict(self, num_blocks: int) -> list[int]:
        cached = set(self.machine.cache._node_of_block)
        victims = self.machine.cache.evict(num_blocks)
        refs = self.machine.expected_refs()
        assert len(victims) >= num_blocks and len(set(victims)) == len(victims)
        assert all(b in cached and b not in refs for b in victims), f"evicted a block in use: {victims}"
        return victims


class RadixMachine(RuleBasedStateMachine):
    """Requests match, allocate, append (copy-on-write), fork, finish (insert + free) and abort; a hog allocates
    to force eviction; reset drops the cache. `content[b]` models what block b's KV stands for: the extra keys
    and every token up to the end of the block, so a served block must equal the query's prefix."""

    @initialize(policy=st.sampled_from(["lru", "lfu", "priority", "cost"]))
    def setup(self, policy):
        self.pool = BlockPool(6)
        self.cache = RadixCache(self.pool, BLOCK_SIZE, policy=policy)
        self.pool.evictor = SpyEvictor(self)
        self.requests: dict[int, tuple[tuple, list[int], list[int]]] = {}  # id -> (extra, tokens, table)
        self.hogs: list[list[int]] = []
        self.content: dict[int, tuple] = {}
        self.next_id = 0

    def expected_refs(self) -> dict[int, int]:
        refs: dict[int, int] = {}
        for table in [r[2] for r in self.requests.values()] + self.hogs:
            for block in table:
                refs[block] = refs.get(block, 0) + 1
        return refs

    def allocate(self, num_blocks: int) -> list[int] | None:
        in_use = set(self.expected_refs())
        ids = self.pool.allocate(num_blocks)
        assert ids is None or not set(ids) & in_use, "handed out a block in use"
        return ids

    def write(self, extra: tuple, tokens: list[int], table: list[int], block_index: int) -> None:
        block = table[block_index]
        assert not self.pool.is_cached(block) and self.pool.ref_counts[block] == 1, "wrote into a shared block"
        self.content[block] = (extra, tuple(tokens[: (block_index + 1) * BLOCK_SIZE]))

    @rule(tokens=prompts, extra=extras, priority=st.integers(0, 2), insert_now=st.booleans())
    def admit(self, tokens, extra, priority, insert_now):
        hit = self.cache.match(tokens, extra)
        assert hit.num_tokens == len(hit.block_ids) * BLOCK_SIZE <= len(tokens)
        for i, block in enumerate(hit.block_ids):
            assert self.content[block] == (extra, tuple(tokens[: (i + 1) * BLOCK_SIZE])), "served a wrong block"
        self.pool.incref(hit.block_ids)
        new = self.allocate(-(-len(tokens) // BLOCK_SIZE) - len(hit.block_ids))
        if new is None:
            self.pool.free(hit.block_ids)
            return
        table = hit.block_ids + new
        for i in range(len(hit.block_ids), len(table)):
            self.write(extra, tokens, table, i)
        if insert_now:  # else only when it finishes: requests computing one prefix at once then duplicate it
            self.insert(extra, tokens, table, priority)
        self.requests[self.next_id] = (extra, list(tokens), table)
        self.next_id += 1

    @rule(tokens=prompts, extra=extras)
    def admit_twins(self, tokens, extra):
        # Two requests with one prompt admitted in the same step: both compute it, the later insert duplicates.
        self.admit(list(tokens), extra, priority=0, insert_now=False)
        self.admit(list(tokens), extra, priority=0, insert_now=False)

    def insert(self, extra: tuple, tokens: list[int], table: list[int], priority: int = 0) -> None:
        result = self.cache.insert(tokens, table, extra, priority=priority)
        num_full = len(tokens) // BLOCK_SIZE
        assert len(result.cached_block_ids) == num_full
        for i, block in enumerate(result.cached_block_ids):
            assert self.content[block] == (extra, tuple(tokens[: (i + 1) * BLOCK_SIZE]))
            assert (block != table[i]) == (table[i] in result.duplicate_block_ids)

    def pick(self, data) -> int:
        return data.draw(st.sampled_from(sorted(self.requests)))

    @precondition(lambda self: self.requests)
    @rule(data=st.data(), token=st.integers(0, 1))
    def append(self, data, token):
        extra, tokens, table = self.requests[self.pick(data)]
        if len(tokens) % BLOCK_SIZE == 0:
            new = self.allocate(1)
            if new is None:
                return
            table.extend(new)
        elif self.pool.ref_counts[table[-1]] > 1:  # a forked partial block: copy on write
            new = self.allocate(1)
            if new is None:
                return
            self.content[new[0]] = self.content[table[-1]]
            self.pool.free([table[-1]])
            table[-1] = new[0]
        tokens.append(token)
        self.write(extra, tokens, table, len(table) - 1)
        if len(tokens) % BLOCK_SIZE == 0:
            self.insert(extra, tokens, table)  # a running request inserts each block as it fills

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def fork(self, data):
        extra, tokens, table = self.requests[self.pick(data)]
        self.pool.incref(table)
        self.requests[self.next_id] = (extra, list(tokens), list(table))
        self.next_id += 1

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def finish(self, data):
        extra, tokens, table = self.requests.pop(self.pick(data))
        self.insert(extra, tokens, table)
        self.pool.free(reversed(table))

    @precondition(lambda self: self.requests)
    @rule(data=st.data())
    def abort(self, data):
        self.pool.free(reversed(self.requests.pop(self.pick(data))[2]))

    @rule(num_blocks=st.integers(1, 4))
    def hog(self, num_blocks):
        ids = self.allocate(num_blocks)
        if ids is not None:
            self.hogs.append(ids)
            for block in ids:
                self.content[block] = ("hog", block)

    @precondition(lambda self: self.hogs)
    @rule()
    def release_hog(self):
        self.pool.free(self.hogs.pop(0))

    @rule(roll=st.integers(0, 4))
    def reset(self, roll):
        if roll:  # a weight update is rare: let the cache fill up in most runs
            return
        num_cached = self.cache.num_cached_blocks
        assert self.cache.reset() == num_cached
        assert self.pool.num_cached_blocks == 0

    @invariant()
    def integrity(self):
        refs = self.expected_refs()
        self.pool.check_integrity(refs)
        self.cache.check_integrity()
        for block, node in self.cache._node_of_block.items():
            path = []
            while node.parent is not None:
                path = list(node.token_ids) + path
                node = node.parent
            assert self.content[block] == (self.cache._node_of_block[block].extra_keys, tuple(path))

    def teardown(self):
        for table in [r[2] for r in self.requests.values()] + self.hogs:
            self.pool.free(reversed(table))
        self.pool.check_integrity({})
        assert self.pool.num_free_blocks == self.pool.num_blocks, "a block leaked"


RadixMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=40, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestRadixProperties = RadixMachine.TestCase
