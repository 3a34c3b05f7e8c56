"""Token pruning keeps at least what it was asked to: sinks that end inside a block keep that whole block, and a
keep ratio that asks for a fraction of a token keeps the token (and the block holding it)."""

from hf_paged.cache.pruning import prompt_budget_blocks, select_blocks


def test_sinks_ending_inside_a_block_keep_the_whole_block():
    # 10 full blocks of 4; sinks 5 tokens -> blocks 0 and 1; window 4 tokens -> block 9
    plan = select_blocks(40, 4, [True] * 10, budget_blocks=3, num_sink_tokens=5, window_tokens=4)
    assert plan.drop_indices == [2, 3, 4, 5, 6, 7, 8] and plan.num_blocks_kept == 3


def test_a_fractional_keep_ratio_rounds_up():
    assert prompt_budget_blocks(66, 0.25, 4, None, 4, 8) == 5  # 16.5 tokens -> 17 -> 5 blocks (not 16 -> 4)
    assert prompt_budget_blocks(66, 0.25, 4, 17, 4, 8) == 5  # the cap itself is whole tokens
