"""A running request inserts its blocks as they fill, one insert per block: each insert walked the tree from the root,
hashing every block again (a token tuple and a digest each), so a request's inserts cost quadratically in its
length (2.4 ms an insert at 32k tokens, 5 s over one such request, on the engine's thread). `insert(known=)`
starts past the caller's own blocks when the tree still holds exactly those; these tests check that it changes
nothing but the work: the same results, tree and evictions as inserts from the root, through duplicates,
evictions of the request's own prefix and resets, and that a request's inserts hash each block once."""

from __future__ import annotations

import random

import pytest

from hf_paged.cache import radix
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.radix import RadixCache

BS = 2


class _Twin:
    """A pool and a tree; `hinted` passes `known=` as the block manager does."""

    def __init__(self, num_blocks: int, hinted: bool) -> None:
        self.pool, self.hinted = BlockPool(num_blocks), hinted
        self.cache = RadixCache(self.pool, BS)
        self.live: dict[int, tuple[list[int], list[int], int]] = {}  # request -> (tokens, table, blocks inserted)

    def start(self, rid: int, prompt: list[int]) -> bool:
        hit = self.cache.match(prompt)
        self.pool.incref(hit.block_ids)
        self.live[rid] = (list(prompt), list(hit.block_ids), len(hit.block_ids))
        return self.grow(rid, [])

    def grow(self, rid: int, new_tokens: list[int]) -> bool:
        """Append tokens (blocks allocated as needed: False, and the request dropped, when the pool is full), then
        insert the full blocks as `KVManager.cache_full_blocks` does."""
        tokens, table, known = self.live[rid]
        tokens += new_tokens
        need = -(-len(tokens) // BS) - len(table)
        if need > 0:
            more = self.pool.allocate(need)
            if more is None:
                self.end(rid)
                return False
            table += more
        full = len(tokens) // BS
        if full > known:
            self.results.append(self.cache.insert(tokens[: full * BS], table[:full], known=known if self.hinted else 0))
            self.live[rid] = (tokens, table, full)
        return True

    def end(self, rid: int) -> None:
        _, table, _ = self.live.pop(rid)
        self.pool.free(reversed(table))

    def state(self) -> tuple:
        return (sorted(self.cache.cached_digests()), list(self.pool.ref_counts), self.pool.num_free_blocks,
                self.cache.num_evicted)

    results: list


@pytest.mark.parametrize("seed", range(6))
def test_inserts_past_known_blocks_give_what_inserts_from_the_root_give(seed):
    rng = random.Random(seed)
    twins = [_Twin(48, hinted=True), _Twin(48, hinted=False)]
    for twin in twins:
        twin.results = []
    prefixes = [[rng.randrange(3) for _ in range(rng.randrange(0, 9))] for _ in range(4)]
    for twin in twins:  # two requests computing the same blocks at once: the second's are duplicates
        twin.start(0, [0])
        twin.start(1, [0])
        twin.grow(0, [1, 2, 0])
        twin.grow(1, [1, 2, 0, 1])
    next_rid, ok = 2, [True, True]
    for _ in range(400):
        live = sorted(twins[0].live)
        if not live or rng.random() < 0.15:  # a new request, often on a shared prefix (hits, duplicates)
            prompt = rng.choice(prefixes) + [rng.randrange(3) for _ in range(rng.randrange(1, 7))]
            ok = [twin.start(next_rid, prompt) for twin in twins]
            next_rid += 1
        elif rng.random() < 0.1:
            rid = rng.choice(live)
            for twin in twins:
                twin.end(rid)
        elif rng.random() < 0.01:
            for twin in twins:
                twin.cache.reset()
        else:
            rid, tokens = rng.choice(live), [rng.randrange(3) for _ in range(rng.randrange(1, 2 * BS + 1))]
            ok = [twin.grow(rid, tokens) for twin in twins]
        assert ok[0] == ok[1]
        assert twins[0].results == twins[1].results
        assert twins[0].state() == twins[1].state()
    for twin in twins:
        twin.cache.check_integrity()
    hinted = twins[0].results
    assert sum(r.duplicate_block_ids != [] for r in hinted) > 0  # the premise: duplicates and evictions happen
    assert twins[0].cache.num_evicted > 0


def test_a_running_request_hashes_each_block_once(monkeypatch):
    hashed = []
    digest = radix.chained_digest
    monkeypatch.setattr(radix, "chained_digest", lambda *args: hashed.append(1) or digest(*args))
    pool = BlockPool(600)
    cache = RadixCache(pool, BS)
    tokens = [i % 7 for i in range(1000)]
    table = pool.allocate(500)
    for full in range(1, 501):
        cache.insert(tokens[: full * BS], table[:full], known=full - 1)
    assert len(hashed) == 500  # from the root: 500 * 501 / 2
    cache.check_integrity()


def test_a_known_count_past_the_table_walks_from_the_root():
    pool = BlockPool(8)
    cache = RadixCache(pool, BS)
    table = pool.allocate(2)
    assert cache.insert([1, 2, 3, 4], table, known=5).num_new_blocks == 2  # (no IndexError, nothing skipped)
    assert cache.insert([1, 2, 3, 4], table, known=2).cached_block_ids == table
    cache.check_integrity()
