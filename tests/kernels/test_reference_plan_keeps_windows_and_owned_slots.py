"""The torch plan (`kernels/reference.py`) reads only what each query may see, on the paths the other kernel tests
leave out: a sliding-window prefill chunk longer than a causal row block (`causal_rows`: those blocks know no
window), and decode rows that share leading blocks (the cascade) where a row's context ends inside a shared block.
NaN fills every slot no row owns."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels import causal_rows
from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan
from tests.kernels.paged_cases import dense_attention, make_case, tolerance


@pytest.mark.parametrize(("context", "new"), [(150, 150), (200, 90)])
def test_a_windowed_chunk_longer_than_a_row_block_keeps_its_window(context, new):
    """The engine's CPU torch path builds its plan `in_place`; a chunk past `CAUSAL_ROW_BLOCK` queries runs in row
    blocks only without a window (a row block's mask is plain causal)."""
    assert new > causal_rows.CAUSAL_ROW_BLOCK
    case = make_case([context, 30], [new, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=16,
                     dtype=torch.float32, device=torch.device("cpu"))
    plan = build_attention_plan(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 16,
                                24, in_place=True)
    out = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_attention(case, 24), **tolerance(torch.float32))
    # the same chunk without a window does run in row blocks (what the windowed one must not do)
    plain = build_attention_plan(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 16,
                                 None, in_place=True)
    out = run_attention_plan(plain, case.query, case.key_cache, case.value_cache, scale=case.scale)
    assert plain.prefills[0].row_blocks is not None
    torch.testing.assert_close(out, dense_attention(case), **tolerance(torch.float32))


def test_a_cascade_shares_only_the_blocks_full_in_every_row():
    """Two decode rows whose tables start with the same 5 blocks, one of them ending inside the 5th (70 keys of
    block size 16): the shared part is the 4 blocks full in both, and the shorter row never reads keys 70 .. 79
    (which hold the longer row's keys, finite: only the answer shows such a read)."""
    case = make_case([100, 70], [1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=16,
                     dtype=torch.float32, device=torch.device("cpu"))
    case.block_tables[1, :5] = case.block_tables[0, :5]
    case.dense_keys[1], case.dense_values[1] = case.dense_keys[0][:70], case.dense_values[0][:70]
    plan = build_attention_plan(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 16)
    (group,) = plan.decodes
    assert group.shared_blocks is not None and group.shared_blocks.numel() == 4
    out = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
    torch.testing.assert_close(out, dense_attention(case), **tolerance(torch.float32))
    capped = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale, softcap=2.0)
    for row, length in ((0, 100), (1, 70)):  # soft-capped: the cascade put back as plain rows (`uncascade`)
        alone = build_attention_plan(case.block_tables[row : row + 1], [0, 1], [length], 16)
        want = run_attention_plan(alone, case.query[row : row + 1], case.key_cache, case.value_cache,
                                  scale=case.scale, softcap=2.0)
        torch.testing.assert_close(capped[row : row + 1], want, **tolerance(torch.float32))


def test_decode_rows_that_share_blocks_keep_their_sliding_window():
    """Rows sharing 5 leading blocks (a prefix-cache hit; row 1's block 5 is its own) under a window of 24: each
    row sees its own last 24 keys (the cascade, which reads its shared part whole, is not for windowed layers)."""
    case = make_case([100, 90], [1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=16,
                     dtype=torch.float32, device=torch.device("cpu"))
    case.block_tables[1, :5] = case.block_tables[0, :5]
    case.dense_keys[1][:80], case.dense_values[1][:80] = case.dense_keys[0][:80], case.dense_values[0][:80]
    args = (case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 16)
    assert build_attention_plan(*args).decodes[0].shared_blocks is not None  # without a window: the cascade
    plan = build_attention_plan(*args, 24)
    out = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
    torch.testing.assert_close(out, dense_attention(case, 24), **tolerance(torch.float32))


def test_decode_rows_of_one_length_sharing_blocks_read_the_shared_part():
    """Forked rows (parallel samples: one length, 5 shared leading blocks, then each its own): the cascade reads the
    shared part once, and the rows' own parts are not taken for their whole context."""
    case = make_case([90, 90, 90], [1, 1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=16,
                     dtype=torch.float32, device=torch.device("cpu"))
    for row in (1, 2):
        case.block_tables[row, :5] = case.block_tables[0, :5]
        case.dense_keys[row][:80], case.dense_values[row][:80] = case.dense_keys[0][:80], case.dense_values[0][:80]
    plan = build_attention_plan(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 16)
    (group,) = plan.decodes
    assert group.shared_blocks is not None and group.shared_blocks.numel() == 5
    out = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
    torch.testing.assert_close(out, dense_attention(case), **tolerance(torch.float32))


@pytest.mark.parametrize("window", [None, 6])
def test_rows_of_one_length_whose_first_row_is_consecutive_read_each_row(window):
    """Rows of one context length read as slices; the first row's blocks lie consecutively in the pool (a fresh
    sequence's usually do), the others' do not: only a lone row is read as one slice of the pool."""
    case = make_case([21, 21], [1, 1], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float32,
                     spare_blocks=8, device=torch.device("cpu"))
    keys, values = torch.full_like(case.key_cache, float("nan")), torch.full_like(case.value_cache, float("nan"))
    pos = torch.arange(21)
    for row, blocks in ((0, torch.arange(2, 8)), (1, torch.tensor([15, 9, 17, 8, 13, 11]))):
        keys[blocks[pos // 4], pos % 4] = case.dense_keys[row]
        values[blocks[pos // 4], pos % 4] = case.dense_values[row]
        case.block_tables[row, :6] = blocks.to(torch.int32)
    case.key_cache, case.value_cache = keys, values
    plan = build_attention_plan(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 4,
                                window)
    (group,) = plan.decodes
    assert group.span is not None and group.rows.numel() == 2
    out = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, dense_attention(case, window), **tolerance(torch.float32))
