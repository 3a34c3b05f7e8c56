"""Scoring rows (`SamplingParams.score_targets`): each target's log-probability under its row's logits, and whether
the row's argmax is the target, written into the request by target index (a recomputed chunk after a preemption
writes the same values again)."""

from __future__ import annotations

import torch

from hf_paged.batching.step_inputs import ScoredRows

__all__ = ["record_scores"]


def record_scores(scored: list[ScoredRows], logits: torch.Tensor) -> None:
    """`logits`: fp32 `[sum of counts, vocab]`, the rows of `scored` in order."""
    if not scored:
        return
    starts = [rows.first - rows.request.score_start for rows in scored]  # each one's first target index
    targets: list[int] = []
    for rows, start in zip(scored, starts):
        targets.extend(rows.request.params.score_targets[start : start + rows.count])
    target = torch.tensor(targets, dtype=torch.long, device=logits.device)
    logits = logits.float()
    # log-softmax at the target only: no second [rows, vocab] tensor (rolling windows score a whole step of rows)
    logprobs = (logits.gather(1, target[:, None]).squeeze(1) - torch.logsumexp(logits, dim=-1)).tolist()
    greedy = (logits.argmax(dim=-1) == target).tolist()
    row = 0
    for rows, start in zip(scored, starts):  # each request's rows are consecutive: one slice each
        end = row + rows.count
        rows.request.score_logprobs[start : start + rows.count] = logprobs[row:end]
        rows.request.score_greedy[start : start + rows.count] = greedy[row:end]
        row = end
