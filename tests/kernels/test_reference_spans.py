"""The torch reference's decode fast paths: rows of one context length read as slices (no zeroing, no mask), and
a lone row whose blocks are consecutive read in place. NaN fills every slot a row does not own."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan
from tests.kernels.paged_cases import dense_attention, make_case, tolerance


def _run(case, window=None):
    plan = build_attention_plan(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(),
                                case.key_cache.shape[1], window)
    out = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
    return plan, out


def _consecutive(case, first: int):
    """The same case with sequence 0's blocks moved to first, first + 1, ... (NaN everywhere else)."""
    bs, ctx = case.key_cache.shape[1], int(case.context_lens[0])
    n = -(-ctx // bs)
    keys, values = torch.full_like(case.key_cache, float("nan")), torch.full_like(case.value_cache, float("nan"))
    pos = torch.arange(ctx)
    keys[first + pos // bs, pos % bs] = case.dense_keys[0]
    values[first + pos // bs, pos % bs] = case.dense_values[0]
    case.key_cache, case.value_cache = keys, values
    case.block_tables[0, :n] = torch.arange(first, first + n, dtype=torch.int32)
    return case


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize("context", [1, 7, 8, 21])
def test_lone_row_in_place_and_gathered(context, window):
    for consecutive in (True, False):
        case = make_case([context], [1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                         dtype=torch.float32, spare_blocks=8)
        if consecutive:
            case = _consecutive(case, first=2)
        plan, out = _run(case, window)
        (group,) = plan.decodes
        one_block = context <= 4  # a single block is always read in place
        assert group.span is not None and (group.span.first_block is not None) == (consecutive or one_block)
        assert torch.isfinite(out).all()
        torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))


@pytest.mark.parametrize("window", [None, 6])
def test_rows_of_one_length_read_as_slices(window):
    case = make_case([13, 13, 13], [1, 1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                     dtype=torch.float32)
    plan, out = _run(case, window)
    assert [g.span is not None for g in plan.decodes] == [True]
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))


def test_rows_of_different_lengths_keep_the_masked_gather():
    case = make_case([5, 13], [1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float32)
    plan, out = _run(case)
    assert all(g.span is None for g in plan.decodes if g.rows.numel() > 1)
    torch.testing.assert_close(out, dense_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("window", [None, 5])
@pytest.mark.parametrize(("context", "new"), [(7, 7), (21, 21), (21, 6), (8, 3)])
def test_a_prefill_whose_blocks_are_consecutive_reads_them_in_place(context, new, window):
    """`in_place=True`: the context is one slice of the pool (NaN around it), with the gather's exact result."""
    case = _consecutive(make_case([context], [new], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4,
                                  dtype=torch.float32, spare_blocks=8), first=2)
    args = (case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 4, window)
    in_place, gathered = build_attention_plan(*args, in_place=True), build_attention_plan(*args)
    assert in_place.prefills[0].first_slot == 8 and gathered.prefills[0].first_slot is None
    out = run_attention_plan(in_place, case.query, case.key_cache, case.value_cache, scale=case.scale)
    assert torch.equal(out, run_attention_plan(gathered, case.query, case.key_cache, case.value_cache,
                                               scale=case.scale))
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))
    case.block_tables[0, 1] = 7  # no longer consecutive: gathered
    assert build_attention_plan(*args, in_place=True).prefills[0].first_slot is None
