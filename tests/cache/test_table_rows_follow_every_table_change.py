"""A step's block tables are built from int32 rows the block manager keeps beside each sequence's list of block ids
(`KVCacheManager.table_row`), extended by what was appended since the step before: converting every table's ints
again cost 3.7 ms CPU a step at 64 sequences of 2,048 blocks. A row read stale after an in-place change (a
copy-on-write of the last block, a truncate then regrowth to the same length, dropped blocks) would send a step's
attention to another sequence's blocks: these tests read the rows after every kind of change."""

from __future__ import annotations

import random

import pytest

from hf_paged.batching.step_inputs import _block_tables
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.radix import RadixCache

BS = 4


@pytest.mark.parametrize("seed", range(8))
def test_every_row_equals_its_block_ids_after_any_change(seed):
    rng = random.Random(seed)
    pool = BlockPool(96)
    cache = RadixCache(pool, BS)
    kv = KVCacheManager(pool, BS, cache)
    tokens: dict[int, list[int]] = {}
    kinds = {"copy-on-write": 0, "truncate": 0, "drop": 0, "fork": 0}
    for step in range(500):
        live = sorted(tokens)
        op = rng.random()
        if not live or op < 0.12:  # a new sequence, often a prefix hit (shared blocks: copy-on-write later)
            prompt = [rng.randrange(2) for _ in range(rng.randrange(2, 14))]
            kv.add_sequence(step, prompt)
            kv.take_partial_block(step, prompt)
            if kv.allocate_slots(step, len(prompt) - kv.num_tokens(step)):
                tokens[step] = prompt
            else:
                kv.free(step)
        elif op < 0.2:
            src = rng.choice(live)
            kv.fork(src, step)
            tokens[step] = list(tokens[src])
            kinds["fork"] += 1
        elif op < 0.3 and len(tokens[live[-1]]) > BS:  # back by a block or more (speculative drafts rejected)
            rid, blocks = live[-1], len(kv.block_ids(live[-1]))
            keep = rng.randrange(1, len(tokens[rid]) - BS + 1)
            kv.truncate(rid, keep)
            del tokens[rid][keep:]
            kinds["truncate"] += len(kv.block_ids(rid)) < blocks
        elif op < 0.35:
            rid = rng.choice(live)
            full = kv.num_tokens(rid) // BS
            private = [i for i in range(full) if kv.is_private(kv.block_ids(rid)[i])]
            if private and cache.epoch == 0:
                kv.drop_blocks(rid, rng.sample(private, rng.randrange(1, len(private) + 1)))
                tokens[rid] = tokens[rid][: kv.num_tokens(rid)]
                kinds["drop"] += 1
        elif op < 0.45:
            rid = rng.choice(live)
            kv.cache_full_blocks(rid, tokens[rid])
            kv.free(rid)
            del tokens[rid]
        else:
            rid = rng.choice(live)
            shared_last = bool(kv.block_ids(rid)) and pool.ref_counts[kv.block_ids(rid)[-1]] > 1
            new = [rng.randrange(2) for _ in range(rng.randrange(1, 2 * BS))]
            if kv.allocate_slots(rid, len(new)):
                kinds["copy-on-write"] += shared_last and kv.num_tokens(rid) - len(new) < len(kv.block_ids(rid)) * BS
                tokens[rid] += new
                kv.cache_full_blocks(rid, tokens[rid])
        kv.take_pending_copies()
        kv.check_integrity()  # (before any read: a change and the next growth may come with no step between)
        if tokens and rng.random() < 0.3:  # a step reads every row
            rows = sorted(tokens)
            table = _block_tables([kv.table_row(r) for r in rows])
            for i, rid in enumerate(rows):
                assert table[i, : len(kv.block_ids(rid))].tolist() == kv.block_ids(rid)
                assert kv.table_row(rid).tolist() == kv.block_ids(rid)
    assert all(kinds.values()), kinds  # the premise: every kind of change happened
