"""`record_scores` gives each target `logits[target] - logsumexp(logits)` with `torch.logsumexp`'s own guard: a row
holding one +inf gives its other targets -inf (probability zero), not NaN; a row of -inf stays NaN as there."""

from __future__ import annotations

import math
from types import SimpleNamespace

import torch

from hf_paged.batching.score_rows import record_scores


def test_non_finite_rows_score_as_logsumexp_does():
    logits = torch.tensor([[float("inf"), 0.0, 1.0], [float("-inf")] * 3, [0.0, 1.0, 2.0]])
    targets = [1, 0, 2]
    request = SimpleNamespace(score_start=0, params=SimpleNamespace(score_targets=targets),
                              score_logprobs=[None] * 3, score_greedy=[None] * 3)
    want = (logits.gather(1, torch.tensor(targets)[:, None]).squeeze(1) - torch.logsumexp(logits, -1)).tolist()
    record_scores([SimpleNamespace(request=request, first=0, count=3)], logits.clone())
    got = request.score_logprobs
    assert got[0] == want[0] == -math.inf
    assert math.isnan(got[1]) and math.isnan(want[1])
    assert got[2] == want[2]
    assert request.score_greedy == [False, True, True]
