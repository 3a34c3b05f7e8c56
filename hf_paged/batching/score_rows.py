"""Scoring rows (`SamplingParams.score_targets`): each target's log-probability under its row's logits, and whether
the row's argmax is the target, written into the request by target index (a recomputed chunk after a preemption
writes the same values again)."""

from __future__ import annotations

import torch

from hf_paged.batching.step_inputs import ScoredRows

__all__ = ["record_scores"]


def record_scores(scored: list[ScoredRows], logits: torch.Tensor) -> None:
    """`logits`: `[sum of counts, vocab]`, the rows of `scored` in order; consumed: fp32 logits are overwritten
    (the engine drops the scored rows after this call)."""
    if not scored:
        return
    starts = [rows.first - rows.request.score_start for rows in scored]  # each one's first target index
    targets: list[int] = []
    for rows, start in zip(scored, starts):
        targets.extend(rows.request.params.score_targets[start : start + rows.count])
    target = torch.tensor(targets, dtype=torch.long, device=logits.device)
    logits = logits.float()
    greedy = (logits.argmax(dim=-1) == target).tolist()
    picked = logits.gather(1, target[:, None]).squeeze(1)
    # log-softmax at the target only, and `torch.logsumexp`'s arithmetic (max, exp of the difference, sum, log, + max:
    # the same bits) done in place: logsumexp allocates a second [rows, vocab] tensor, and on a rolling window's
    # 1,024 rows of a 50,257-token vocabulary that tensor's fresh pages cost as much as the arithmetic (230 -> 114 ms)
    top = logits.amax(dim=-1, keepdim=True)
    top = top.masked_fill(top.isinf(), 0.0)  # logsumexp's guard: a row of -inf (or one +inf) stays -inf (+inf)
    with torch.inference_mode():  # (the runner's logits are inference tensors: in place only in this mode)
        log_total = logits.sub_(top).exp_().sum(dim=-1).log_().add_(top.squeeze(1))
    logprobs = (picked - log_total).tolist()
    row = 0
    for rows, start in zip(scored, starts):  # each request's rows are consecutive: one slice each
        end = row + rows.count
        rows.request.score_logprobs[start : start + rows.count] = logprobs[row:end]
        rows.request.score_greedy[start : start + rows.count] = greedy[row:end]
        row = end
