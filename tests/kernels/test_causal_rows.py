"""Causal prefill chunks in row blocks (`kernels/causal_rows.py`): each block over the keys its rows see equals the
dense causal attention; a chunk with no cached prefix past `CAUSAL_ROWS_MAX_PLAIN` queries runs whole."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels import causal_rows
from hf_paged.cache.kernels.reference import build_attention_plan, run_attention_plan
from tests.kernels.paged_cases import dense_attention, make_case, tolerance


@pytest.mark.parametrize(("context", "new", "in_rows"), [(10, 10, True), (21, 21, False), (30, 20, True),
                                                         (30, 3, False)])
def test_row_blocks_equal_dense_causal_attention(monkeypatch, context, new, in_rows):
    monkeypatch.setattr(causal_rows, "CAUSAL_ROW_BLOCK", 4)
    monkeypatch.setattr(causal_rows, "CAUSAL_ROWS_MAX_PLAIN", 12)
    case = make_case([context], [new], num_heads=4, num_kv_heads=2, head_dim=8, block_size=4, dtype=torch.float32)
    plan = build_attention_plan(case.block_tables, case.query_start_loc.tolist(), case.context_lens.tolist(), 4,
                                None, in_place=True)
    (group,) = plan.prefills
    assert group.causal
    out = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
    in_rows = in_rows and case.query.device.type == "cpu"  # a CPU path: a GPU's kernels skip masked key blocks
    assert (group.row_blocks is not None) == in_rows
    if in_rows:  # blocks of 4 rows, each over the keys up to its last row
        assert [(b.start, b.end, b.num_keys) for b in group.row_blocks][:2] == [
            (0, 4, context - new + 4), (4, 8, context - new + 8)]
        again = run_attention_plan(plan, case.query, case.key_cache, case.value_cache, scale=case.scale)
        assert torch.equal(again, out)  # the next layer reuses the blocks
    torch.testing.assert_close(out, dense_attention(case), **tolerance(torch.float32))


def test_when_row_blocks_pay():
    limit = causal_rows.CAUSAL_ROWS_MAX_PLAIN
    assert not causal_rows.pays(causal_rows.CAUSAL_ROW_BLOCK, after_prefix=True)  # one block: one call anyway
    assert causal_rows.pays(limit, after_prefix=False) and not causal_rows.pays(limit + 1, after_prefix=False)
    assert causal_rows.pays(4 * limit, after_prefix=True)  # after a prefix the whole chunk would be masked pairs
