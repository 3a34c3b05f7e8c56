"""Block-sparse prefill's estimate (`sparse_prefill._sample_attention`, behind "vertical_slash" and "auto"): the
sample rows' probabilities are their exact causal attention, each query seeing every key up to its own position,
itself included (the tests of the selection only check which blocks it keeps, and those rarely turn on one key)."""

from __future__ import annotations

import pytest
import torch

from hf_paged.cache.sparse_prefill import _sample_attention


@pytest.mark.parametrize(("context_len", "q_len", "rows"), [(200, 130, slice(66, 130)), (300, 300, slice(64, 128)),
                                                              (96, 64, slice(0, 64))])
def test_the_sample_is_exact_causal_attention(context_len, q_len, rows):
    g = torch.Generator().manual_seed(0)
    heads, dim = 4, 8
    q, k = torch.randn(q_len, heads, dim, generator=g), torch.randn(heads, context_len, dim, generator=g)
    probs, first = _sample_attention(q, k, rows, 0.3)
    assert first == context_len - q_len + rows.start
    positions = torch.arange(first, first + rows.stop - rows.start)
    seen = torch.arange(first + rows.stop - rows.start)
    logits = torch.einsum("shd,hkd->hsk", q[rows] * 0.3, k[:, : seen.numel()])
    want = logits.masked_fill(seen[None, None, :] > positions[None, :, None], float("-inf")).softmax(-1)
    torch.testing.assert_close(probs, want, atol=1e-6, rtol=1e-5)
    diagonal = probs[:, torch.arange(positions.numel()), positions]
    assert bool((diagonal > 0).all())  # each query's own key counts
