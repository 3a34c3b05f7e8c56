"""Token pruning policies (block selection, scores) and the manager's block-dropping mechanics."""

import pytest
import torch

from hf_paged import PagedConfig
from hf_paged.cache.block_pool import BlockPool
from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan
from hf_paged.cache.kv_manager import KVCacheManager
from hf_paged.cache.pruning import (
    check_pruning,
    hide_positions,
    observation_scores,
    pooled_block_scores,
    prompt_budget_blocks,
    pyramid_budgets,
    select_blocks,
)


def test_streaming_keeps_sinks_and_recent_window():
    plan = select_blocks(10 * 4 + 2, 4, [True] * 10 + [False], budget_blocks=4, num_sink_tokens=4, window_tokens=8)
    # window: positions 34..41, so blocks 8 (from its middle), 9 and 10 (partial); sink: block 0
    assert plan.drop_indices == [1, 2, 3, 4, 5, 6, 7]
    assert plan.num_blocks_kept == 4


def test_snapkv_fills_the_budget_with_the_best_scored_blocks():
    scores = torch.tensor([0.0, 5.0, 1.0, 9.0, 2.0, 0.0, 0.0, 0.0])
    plan = select_blocks(32, 4, [True] * 8, budget_blocks=5, num_sink_tokens=4, window_tokens=8,
                         block_scores=scores)
    assert plan.drop_indices == [2, 4, 5]  # kept: sink 0, window 6 7, best scored 3 and 1


def test_blocks_that_may_not_be_dropped_are_kept_and_count_against_the_budget():
    scores = torch.tensor([0.0, 5.0, 1.0, 9.0, 2.0, 0.0, 0.0, 0.0])
    evictable = [True, True, True, False, True, True, True, True]  # block 3 may not be dropped
    plan = select_blocks(32, 4, evictable, budget_blocks=5, num_sink_tokens=4, window_tokens=8, block_scores=scores)
    assert plan.drop_indices == [2, 4, 5]  # 3 kept as it must be, then 1 by score


def test_budget_follows_keep_ratio_with_a_floor_of_sinks_plus_window():
    assert prompt_budget_blocks(400, 0.25, 16, None, 16, 32) == 7  # 100 tokens
    assert prompt_budget_blocks(100, 0.25, 16, None, 16, 32) == 3  # 25 < 48: sinks + window
    assert prompt_budget_blocks(400, 0.5, 16, 64, 16, 32) == 4  # capped by kv_budget_tokens


def test_invalid_eviction_settings_name_the_field_and_allowed_values():
    with pytest.raises(ValueError, match=r"kv_pruning='h2o' is not implemented; use one of \[None, 'streaming', 'snapkv', 'pyramidkv'\]"):
        check_pruning("h2o", 0.5, 16, 32, None)
    with pytest.raises(ValueError, match="kv_budget_tokens=40 is smaller than num_sink_tokens \\+ window_tokens = 48"):
        PagedConfig(kv_pruning="streaming", kv_budget_tokens=40, num_sink_tokens=16, window_tokens=32)
    with pytest.raises(ValueError, match=r"kv_pruning must be one of \[None, 'streaming', 'snapkv', 'pyramidkv'\]"):
        PagedConfig(kv_pruning="h2o")


def test_observation_scores_are_each_heads_strongest_causal_attention():
    q = torch.zeros(3, 2, 4)  # zero queries: uniform attention over the visible keys
    k = torch.randn(3, 1, 4)  # GQA: one KV head for two query heads
    scores = observation_scores(q, k, 2, 0.5)  # queries at positions 1 and 2 of 3 keys
    assert scores.shape == (2, 3)
    assert torch.allclose(scores, torch.tensor([[1 / 2, 1 / 2, 1 / 3]] * 2))  # max over the two queries


def test_pooled_block_scores_take_the_most_interested_head():
    token = torch.zeros(2, 12)
    token[0, 4] = 1.0  # head 0: a peak, pooled over 7 neighbours: positions 1..7 score 1
    token[1, 8:] = 0.5  # head 1: a plateau over the last block
    assert pooled_block_scores(token, 4).tolist() == [3.0, 4.0, 2.0]


def test_manager_drops_full_blocks_and_shifts_new_slots():
    pool = BlockPool(8)
    kv = KVCacheManager(pool, 4)
    kv.add_sequence("a")
    kv.allocate_slots("a", 14)  # blocks [0, 1, 2, 3], 14 tokens
    kv.fork("a", "b")  # every block now shared
    kv.drop_blocks("b", [1])  # a shared block leaves b's table only
    assert kv.block_ids("b") == [0, 2, 3] and kv.block_ids("a") == [0, 1, 2, 3] and pool.ref_counts[1] == 1
    kv.free("b")
    kv.drop_blocks("a", [1, 2])
    assert kv.block_ids("a") == [0, 3] and kv.num_tokens("a") == 6 and kv.num_dropped_tokens("a") == 8
    assert kv.slots("a", 14, 16) == [3 * 4 + 2, 3 * 4 + 3]  # logical 14, 15 -> table positions 6, 7
    with pytest.raises(ValueError, match="only full blocks can be dropped"):
        kv.drop_blocks("a", [1])  # the partial last block stays
    kv.check_integrity()
    assert pool.num_free_blocks == 6


def test_pyramid_budgets_shrink_with_depth_around_the_snapkv_budget():
    assert pyramid_budgets(8, 5, 2) == [12, 10, 8, 6, 4]
    assert pyramid_budgets(4, 3, 3) == [6, 4, 3]  # floored at sinks + window


@pytest.mark.parametrize("q_len", [1, 3])
def test_hidden_blocks_are_invisible_like_removed_ones(q_len):
    torch.manual_seed(0)
    key, value = torch.randn(6, 4, 1, 8), torch.randn(6, 4, 1, 8)  # 6 blocks of 4, 1 KV head
    query = torch.randn(q_len, 2, 8)
    full = build_attention_plan(torch.tensor([[5, 2, 0, 3]]), [0, q_len], [15], 4)
    hidden = hide_positions(full, {0: torch.arange(4, 8)}, [0, q_len], [15], 4)  # hide table block 1 (b2)
    removed = build_attention_plan(torch.tensor([[5, 0, 3]]), [0, q_len], [11], 4)
    got = run_attention_plan(hidden, query, key, value, scale=0.3)
    assert torch.allclose(got, run_attention_plan(removed, query, key, value, scale=0.3), atol=1e-6)
    assert not torch.allclose(got, run_attention_plan(full, query, key, value, scale=0.3), atol=1e-3)


def test_hidden_blocks_of_decodes_that_share_leading_blocks():
    """Decode rows that share >= 4 leading blocks attend them once (cascade); PyramidKV's hidden positions count
    from block 0, the shared blocks included (the h55 pass: they were applied to the rows' own blocks and the
    shared part dropped: passkeys 0/10 with prefix caching on)."""
    torch.manual_seed(0)
    key, value = torch.randn(12, 4, 1, 8), torch.randn(12, 4, 1, 8)
    query = torch.randn(2, 2, 8)
    tables = torch.tensor([[5, 2, 0, 3, 7, 8], [5, 2, 0, 3, 9, 10]])  # 4 shared blocks, then each row's own
    full = build_attention_plan(tables, [0, 1, 2], [23, 21], 4)
    assert full.decodes[0].shared_blocks is not None
    hidden = hide_positions(full, {0: torch.arange(4, 8), 1: torch.arange(16, 20)}, [0, 1, 2], [23, 21], 4)
    got = run_attention_plan(hidden, query, key, value, scale=0.3)
    for row, table, length in ((0, [5, 0, 3, 7, 8], 19), (1, [5, 2, 0, 3, 10], 17)):  # the hidden block removed
        alone = build_attention_plan(torch.tensor([table]), [0, 1], [length], 4)
        want = run_attention_plan(alone, query[row : row + 1], key, value, scale=0.3)
        assert torch.allclose(got[row : row + 1], want, atol=1e-6), row


def test_soft_capped_decodes_that_share_leading_blocks_read_the_shared_blocks():
    torch.manual_seed(0)
    key, value = torch.randn(12, 4, 1, 8), torch.randn(12, 4, 1, 8)
    query = torch.randn(2, 2, 8) * 4
    tables = torch.tensor([[5, 2, 0, 3, 7, 8], [5, 2, 0, 3, 9, 10]])
    got = run_attention_plan(build_attention_plan(tables, [0, 1, 2], [23, 21], 4), query, key, value, scale=0.3,
                             softcap=2.0)
    for row, length in ((0, 23), (1, 21)):
        alone = build_attention_plan(tables[row : row + 1], [0, 1], [length], 4)
        want = run_attention_plan(alone, query[row : row + 1], key, value, scale=0.3, softcap=2.0)
        assert torch.allclose(got[row : row + 1], want, atol=1e-6), row


def test_snapkv_that_keeps_everything_is_refused():
    """kv_keep_ratio 1 (the default) and no budget: SnapKV would keep every block (h55: 0 of 40 dropped)."""
    with pytest.raises(ValueError, match=r"kv_pruning='snapkv' does nothing here: it acts only with kv_keep_ratio < 1"):
        PagedConfig(kv_pruning="snapkv")
    PagedConfig(kv_pruning="snapkv", kv_keep_ratio=0.5)
    PagedConfig(kv_pruning="streaming")  # bounds a long generation at any ratio
