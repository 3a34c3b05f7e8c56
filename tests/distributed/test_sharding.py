"""`plan_shards`: prefix groups on one rank, balanced by tokens, split only when a group is over a fair share."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hf_paged.cache.radix import prefix_digests
from hf_paged.distributed import plan_shards

BS = 4


def test_groups_by_first_block_and_balances_largest_first():
    a, b = [1, 1, 1, 1], [2, 2, 2, 2]
    prompts = [a + [5], [9, 9], b + [6, 6], a + [7, 7, 7], b + [8], [3] * 10]
    plan = plan_shards(prompts, 2, block_size=BS)
    # costs: group a = 5 + 7 - 4 = 8, group b = 6 + 5 - 4 = 7, [9, 9] = 2 (no full block: alone), [3]*10 = 10
    # largest first onto the lightest rank: 10 -> r0, 8 -> r1, 7 -> r1 (8 vs 10? no: r1=8 < r0=10), 2 -> r0
    assert plan.rank_of == (1, 0, 1, 1, 1, 0)
    assert plan.num_tokens == (12, 15) and plan.num_groups == 4
    assert plan.indices(1) == [0, 2, 3, 4]


def test_output_budget_counts_per_prompt():
    plan = plan_shards([[1] * 3, [2] * 3, [3] * 3], 2, block_size=BS, max_new_tokens=[20, 1, 1])
    assert plan.rank_of == (0, 1, 1) and plan.num_tokens == (23, 8)


def test_a_group_over_a_fair_share_splits_by_its_next_block():
    preamble = [7] * (2 * BS)  # every prompt shares it: one group would leave the second rank idle
    x, y = [1] * BS, [2] * BS
    prompts = [preamble + x + [i] for i in range(3)] + [preamble + y + [i] for i in range(3)]
    plan = plan_shards(prompts, 2, block_size=BS)
    assert plan.rank_of[:3] == (plan.rank_of[0],) * 3 and plan.rank_of[3:] == (plan.rank_of[3],) * 3
    assert plan.rank_of[0] != plan.rank_of[3]
    # each part computes the preamble and its own block once: 3 blocks + 3 tails
    assert plan.num_tokens == (15, 15) and plan.num_groups == 2


def test_identical_prompts_spread_only_when_it_pays():
    # 8 output tokens each: one rank would do 8 + 4 x 8 = 40; spread, 2 x (8 + 8) each
    assert sorted(plan_shards([[4] * 8] * 4, 2, block_size=BS, max_new_tokens=8).rank_of) == [0, 0, 1, 1]
    # no output: one rank computes the shared prompt once (8); spreading would cost each rank more (16)
    assert plan_shards([[4] * 8] * 4, 2, block_size=BS).rank_of == (0, 0, 0, 0)


def test_a_group_just_over_a_fair_share_stays_whole_when_splitting_costs_more():
    plan = plan_shards([[1] * 8 + [2], [1] * 8 + [3], [5] * 9], 2, block_size=8)
    assert plan.rank_of == (0, 0, 1) and plan.num_tokens == (10, 9)  # split: 9 + 9 on one rank, 9 on the other


def test_one_rank_and_no_prompts():
    assert plan_shards([[1] * 9, [2]], 1, block_size=BS).rank_of == (0, 0)
    empty = plan_shards([], 3)
    assert empty.rank_of == () and empty.num_tokens == (0, 0, 0) and empty.num_ranks == 3


@pytest.mark.parametrize("kwargs", [{"num_ranks": 0}, {"num_ranks": True}, {"num_ranks": 2, "block_size": 0},
                                    {"num_ranks": 2, "max_new_tokens": [1]}])
def test_bad_arguments(kwargs):
    with pytest.raises(ValueError):
        plan_shards([[1, 2], [3]], **kwargs)


prompt = st.lists(st.integers(0, 2), min_size=0, max_size=14)  # a tiny alphabet: many shared blocks


@settings(max_examples=150, deadline=None)
@given(st.lists(prompt, max_size=24), st.integers(1, 4), st.integers(0, 6))
def test_properties(prompts, num_ranks, max_new_tokens):
    plan = plan_shards(prompts, num_ranks, block_size=BS, max_new_tokens=max_new_tokens)
    assert len(plan.rank_of) == len(prompts) and all(0 <= r < num_ranks for r in plan.rank_of)
    assert plan == plan_shards([list(p) for p in prompts], num_ranks, block_size=BS, max_new_tokens=max_new_tokens)
    costs = [len(p) + max_new_tokens for p in prompts]
    assert sum(plan.num_tokens) <= sum(costs)  # shared blocks count once

    def group_cost(members):  # distinct full blocks once, partial blocks and outputs each
        blocks = {d for i in members for d in prefix_digests(prompts[i], BS)}
        return BS * len(blocks) + sum(len(prompts[i]) % BS + max_new_tokens for i in members)

    by_first: dict[object, list[int]] = {}
    for i, p in enumerate(prompts):
        key = prefix_digests(p[:BS], BS)[0] if len(p) >= BS else i
        by_first.setdefault(key, []).append(i)
    first_total = sum(group_cost(m) for m in by_first.values())
    # prompts sharing a first block share a rank unless their group costs more than a fair share
    for members in by_first.values():
        if group_cost(members) * num_ranks <= first_total:
            assert len({plan.rank_of[i] for i in members}) == 1
    # largest first onto the lightest rank: the busiest rank is within one group of a fair share (a final group
    # is a first-block group or a part of one, never costlier)
    total = sum(plan.num_tokens)
    assert max(plan.num_tokens) <= total / num_ranks + max(total / num_ranks, max(costs, default=0))
    assert max(plan.num_tokens) <= max((group_cost(m) for m in by_first.values()), default=0) + total / num_ranks
