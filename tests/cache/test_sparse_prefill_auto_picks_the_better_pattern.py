"""Block-sparse prefill's "auto" (`sparse_prefill._per_head_choice`): per KV head, the selection of whichever
pattern keeps more of the exact attention of the held-out query block (the chunk's middle one, `nqb // 2 - 1`)."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.kernels.block_sparse import SPARSE_BLOCK
from hf_paged.cache.sparse_prefill import select_blocks

CONTEXT, Q_LEN, HEADS, KV_HEADS, DIM, RATIO, SCALE = 1024, 512, 8, 4, 16, 0.5, 0.25


def _exact_mass(q, k, i):
    """[KV heads, key blocks]: attention mass of query block i's queries (their query heads summed) per key block."""
    group, first = HEADS // KV_HEADS, CONTEXT - Q_LEN + i * SPARSE_BLOCK
    keys = k.repeat_interleave(group, dim=1).transpose(0, 1)[:, : first + SPARSE_BLOCK]  # [H, c', D]
    logits = torch.einsum("shd,hkd->hsk", q[i * SPARSE_BLOCK : (i + 1) * SPARSE_BLOCK] * SCALE, keys)
    positions, seen = torch.arange(first, first + SPARSE_BLOCK), torch.arange(keys.shape[1])
    probs = logits.masked_fill(seen[None, None, :] > positions[None, :, None], float("-inf")).softmax(-1)
    mass = probs.sum(1).view(KV_HEADS, group, -1).sum(1)
    return mass.view(KV_HEADS, -1, SPARSE_BLOCK).sum(-1)


@pytest.mark.parametrize("seed", [0, 1])
def test_auto_takes_each_heads_pattern_of_higher_recall(seed):
    g = torch.Generator().manual_seed(seed)
    q, k = torch.randn(Q_LEN, HEADS, DIM, generator=g), torch.randn(CONTEXT, KV_HEADS, DIM, generator=g)
    i = Q_LEN // SPARSE_BLOCK // 2 - 1
    mass = _exact_mass(q, k, i)
    picks = {p: select_blocks(q, k, p, RATIO, scale=SCALE) for p in ("auto", "block", "vertical_slash")}
    recall = {p: [float(mass[h, s.blocks[h, i, : int(s.keep[h, i])]].sum()) for h in range(KV_HEADS)]
              for p, s in picks.items() if p != "auto"}
    margins = []
    for h in range(KV_HEADS):
        better = "block" if recall["block"][h] > recall["vertical_slash"][h] else "vertical_slash"
        margins.append(abs(recall["block"][h] - recall["vertical_slash"][h]))
        assert torch.equal(picks["auto"].blocks[h], picks[better].blocks[h]), (h, recall)
    assert max(margins) > 0.05  # the patterns do disagree here
