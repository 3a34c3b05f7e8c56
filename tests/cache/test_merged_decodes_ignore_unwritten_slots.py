"""A merged layer's decode (`head_merge_attention`) reads each row's blocks whole: the slots past a row's context
are masked, and zeroed before the matmuls, so whatever the pool holds there (it is `torch.empty`: NaN or inf is
possible) never reaches the output (0 x NaN is NaN)."""

import torch

from hf_paged.cache.head_merge import LayerMerge
from hf_paged.cache.head_merge_attention import MergedIndices, run_merged_plan
from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan


def test_nan_in_unwritten_slots_does_not_reach_merged_decodes():
    torch.manual_seed(0)
    bs, blocks, heads, kv_heads, dim = 4, 40, 4, 2, 8
    keys, values = torch.randn(blocks, bs, kv_heads, dim), torch.randn(blocks, bs, kv_heads, dim)
    shared = list(range(5))
    tables = torch.tensor([shared + [5, 6, 7], shared + [8, 9, 10], shared + [11, 12, 13]])
    context_lens = [30, 23, 25]  # ragged decodes: the last blocks 7, 10, 13 are written up to slot 2, 3, 1
    plan = build_attention_plan(tables, [0, 1, 2, 3], context_lens, bs, in_place=True)
    assert plan.decodes and not plan.prefills
    q = torch.randn(3, heads, dim)
    want = run_attention_plan(plan, q, keys, values, scale=0.3)
    poisoned_k, poisoned_v = keys.clone(), values.clone()
    for block, first_unwritten in ((7, 2), (10, 3), (13, 1)):
        poisoned_k[block, first_unwritten:] = float("nan")
        poisoned_v[block, first_unwritten:] = float("nan")
    identity = MergedIndices(LayerMerge((0, 1, 2, 3), kv_heads), q.device)
    got = run_merged_plan(plan, identity, q, poisoned_k, poisoned_v, scale=0.3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got, want)
    merged = MergedIndices(LayerMerge((0, 1, 0, 1), kv_heads), q.device)  # keys of KV head 0 only
    got = run_merged_plan(plan, merged, q, poisoned_k[:, :, :1].contiguous(), poisoned_v, scale=0.3)
    assert torch.isfinite(got).all()
    torch.testing.assert_close(got[:, :2], want[:, :2])
