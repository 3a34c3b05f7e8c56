"""SnapKV / PyramidKV keep the same blocks of a prompt, and so give the same greedy tokens, whatever the prefix cache
held when the prompt started (docs/ARCHITECTURE.md, "Schedule-independent"). The h5 pass: a prefix hit's shared
blocks were never dropped (they took the budget from the blocks the scores chose), and a hit reaching into the
prompt's last 32 queries left their votes out of the scores; a prompt run alone, after a prompt sharing 50 tokens, or
beside it, gave three different answers. Blocks a prefix hit may serve are still served."""

from __future__ import annotations

import pytest
import torch

from hf_paged import Engine, PagedConfig, SamplingParams
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.radix import RadixCache
from tests.tiny_models import ragged_prompts, tiny_model

BS = 4


@pytest.fixture(scope="module")
def model():
    torch.set_num_threads(1)
    return tiny_model("llama")


def run(model, policy, prompts, *, budget=16, one_by_one=False, prefix_caching=True):
    engine = Engine(model, PagedConfig(block_size=BS, kv_pruning=policy, kv_budget_tokens=budget, num_sink_tokens=4,
                                       window_tokens=8, enable_prefix_caching=prefix_caching))
    outs = []
    for group in ([[p] for p in prompts] if one_by_one else [prompts]):
        ids = [engine.add_request(p, SamplingParams(max_new_tokens=16)) for p in group]
        while engine.has_unfinished:
            engine.step()
            engine.check_integrity()
        outs += [engine.pop_output(i) for i in ids]
    assert all(o.error is None for o in outs)
    return outs


@pytest.mark.parametrize("policy", ["snapkv", "pyramidkv"])
@pytest.mark.parametrize("seed, budget", [(2, 16), (5, 16), (3, 24)])  # snapkv differed at (5, 16) and (3, 24)
def test_a_prompt_alone_after_or_beside_one_sharing_its_start_gives_the_same_tokens(model, policy, seed, budget):
    base = ragged_prompts([60], seed=seed)[0]
    prompt = base[:50] + [4, 5, 6]  # shares 50 tokens with `base`
    (alone,) = run(model, policy, [prompt], budget=budget, prefix_caching=False)
    (cold,) = run(model, policy, [prompt], budget=budget)
    after = run(model, policy, [base, prompt], budget=budget, one_by_one=True)[1]
    beside = run(model, policy, [base, prompt], budget=budget)[1]
    again = run(model, policy, [prompt, prompt], budget=budget, one_by_one=True)[1]
    assert after.num_cached_tokens >= 4 and again.num_cached_tokens >= 4  # the sink block at least is served
    for out in (cold, after, beside, again):
        assert out.generated_tokens == alone.generated_tokens


@pytest.mark.parametrize("policy", ["snapkv", "pyramidkv"])
@pytest.mark.parametrize("seed", [0, 2])
def test_a_prefix_hit_never_serves_the_prompts_observation_window(model, policy, seed):
    """A 12-token prompt fits its budget (sinks + window): nothing pruned, its 3 blocks cached. A 40-token prompt
    starting with it may be served only its first 40 - 32 tokens: the other 4 are observation queries that vote."""
    short = ragged_prompts([12], seed=seed)[0]
    prompt = short + ragged_prompts([28], seed=seed + 100)[0]
    config = {"block_size": BS, "kv_pruning": policy, "kv_keep_ratio": 0.25, "num_sink_tokens": 4,
              "window_tokens": 8}
    engine = Engine(model, PagedConfig(**config, enable_prefix_caching=False))
    alone = engine.run([engine.add_request(prompt, SamplingParams(max_new_tokens=16))])
    engine = Engine(model, PagedConfig(**config))
    engine.run([engine.add_request(short, SamplingParams(max_new_tokens=1))])
    assert engine.kv.prefix_cache.match(short + [0]).num_tokens == 12
    after = engine.run([engine.add_request(prompt, SamplingParams(max_new_tokens=16))])
    (alone,), (after,) = alone.values(), after.values()
    assert after.num_cached_tokens == 8
    assert after.generated_tokens == alone.generated_tokens
    engine.check_integrity()


def test_a_shared_block_leaves_only_the_table_that_drops_it():
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=BS)
    kv = KVCacheManager(pool, BS, cache)
    tokens = list(range(1, 13))
    kv.add_sequence("a", tokens)
    assert kv.allocate_slots("a", 12)
    kv.cache_full_blocks("a", tokens)
    kv.add_sequence("b", tokens + [99])  # hits the first two blocks
    assert kv.allocate_slots("b", 5)
    shared = kv.block_ids("b")[1]
    kv.drop_blocks("b", [1])
    assert shared not in kv.block_ids("b") and shared in kv.block_ids("a") and pool.ref_counts[shared] == 1
    assert cache.match(tokens).num_tokens == 12  # still served to the next prompt
    kv.check_integrity()


def test_pyramid_hiding_keeps_the_k_v_written_after_it_out_of_the_prefix_cache():
    """PyramidKV may hide blocks without dropping any (the first layer's budget holds the whole prompt): the K/V of
    the generated tokens come from the pruned view, and a prompt that goes on past the first one's end would be
    served them in place of its own."""
    pool = BlockPool(8)
    cache = RadixCache(pool, block_size=BS)
    kv = KVCacheManager(pool, BS, cache)
    tokens = list(range(1, 19))  # 18 tokens: a 10-token prompt, then generated ones
    kv.add_sequence("a", tokens[:10])
    assert kv.allocate_slots("a", 10)
    kv.set_hidden_blocks("a", {0: [], 1: [1]})
    assert kv.allocate_slots("a", 8)
    kv.cache_full_blocks("a", tokens)
    assert cache.match(tokens).num_tokens == 8  # the prompt's two full blocks only
    assert not kv.cache_tail("a", tokens[:18])
    kv.check_integrity()
